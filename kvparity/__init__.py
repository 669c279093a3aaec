"""kvparity: proof that a refactor of SGLang's KV-cache index path changed nothing.

The data flows one way, and so do the imports: ``model`` (what is checked), ``engine`` (playing
it), ``judge`` (comparing and the oracles), ``report``, ``run`` (played and judged end to end),
then ``golden``, ``candidate``, ``teeth`` and ``cli``. ``kernels``, ``mem_cache``, ``legacy`` and
``refactored`` are SGLang's model code and what it shares (``docs/layout.md``)."""

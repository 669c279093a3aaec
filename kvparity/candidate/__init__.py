"""Plug-in candidates: the target registry, loading, drawn kernel inputs, the sandbox, and the check."""

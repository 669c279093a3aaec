"""The version adapter table: what differs, on the KV-index path, between the SGLang releases
kvparity drives for real. One frozen ``VersionEntry`` per supported version.

Every entry was written from the release's own source (``pip download --no-deps sglang==V``) and is
checked against the imported code when a worker starts (``adapter.verify_entry``), so a wrong
entry fails loudly instead of driving the wrong code. This module never imports sglang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from parity.real import RealSGLangError

# Qualified names ("module:attribute" or "module:Class.method") of where things live.
_SB = "sglang.srt.managers.schedule_batch"
_COMMON = "sglang.srt.mem_cache.common"
_SERVER_ARGS = "sglang.srt.server_args"

# ``ScheduleBatch.init_new`` and ``ScheduleBatch.release_req``: the same in 0.5.3 .. 0.5.4.
# ("remaing" is SGLang's spelling.)
_INIT_NEW = (
    "reqs", "req_to_token_pool", "token_to_kv_pool_allocator", "tree_cache", "model_config",
    "enable_overlap", "spec_algorithm", "chunked_req",
)
_RELEASE_REQ = ("idx", "remaing_req_count", "server_args")

# SGLang's out-of-memory RuntimeError messages start with these (kvparity classifies failures by
# them). Keys: "rows" (alloc_req_slots), "extend_1" (page size 1 extend), "extend_paged",
# "decode_1", "decode_paged".
_OOM_SCHEDULE_BATCH = {
    "rows": "alloc_req_slots runs out of memory.",
    "extend_1": "Prefill out of memory.",  # f"{phase_str} out of memory." with phase "Prefill"
    "extend_paged": "Prefill out of memory.",
    "decode_1": "Decode out of memory.",
    "decode_paged": "Decode out of memory.",
}
_OOM_COMMON = {
    "rows": "alloc_req_slots runs out of memory.",
    "extend_1": "Out of memory.",  # mem_cache/common.py alloc_token_slots: no phase word any more
    "extend_paged": "Prefill out of memory.",
    "decode_1": "Out of memory.",
    "decode_paged": "Decode out of memory.",
}


@dataclass(frozen=True)
class VersionEntry:
    version: str  # "0.5.3"
    family: str  # "legacy" (before PR #11200) or "refactored"
    # Where the refactored prefix+extend write lives; None when the version has none (legacy
    # writes the prefix in its per-request loop and the extend part with its own kernel).
    write_cache_indices: str | None
    # Where get_last_loc lives (legacy calls it on the extend path; later versions do not).
    get_last_loc: str
    # Where the KV allocation of prepare_for_extend lives (its alloc_extend call is where
    # ``last_loc`` is observed).
    alloc_extend_caller: str
    # How the scheduler's global server arguments are set:
    #   "dict": update the module dict ``global_server_args_dict`` of schedule_batch with
    #           ``speculative_algorithm`` (SpeculativeAlgorithm.NONE, as ModelRunner does) and
    #           ``attention_backend``;
    #   "server_args": ``server_args.set_global_server_args_for_scheduler(ServerArgs)``; readers
    #           call ``get_global_server_args()``.
    globals_style: str
    globals_target: str
    init_new_params: tuple[str, ...] = _INIT_NEW
    release_req_params: tuple[str, ...] = _RELEASE_REQ
    # What ScheduleBatch.release_req does with a radix-cache request:
    #   "free_row_columns": frees row columns [floor(len(prefix)/ps)*ps, seq_len), frees the row,
    #                       dec_lock_ref, evicts remaining*retract_decode_steps;
    #   "cache_finished_req_no_insert": tree_cache.cache_finished_req(req, is_insert=False), then
    #                       the same eviction.
    release_req_kind: str = "free_row_columns"
    # Where the retract eviction step count (20) comes from.
    retract_decode_steps: str = "sglang.global_config:global_config.retract_decode_steps"
    # Req.prefix_indices default and reset_for_retract value: "list" ([]) or "int64" (empty tensor).
    prefix_default: str = "int64"
    # ChunkCache.cache_unfinished_req: "int32 view" (aliases req_to_token) or "int64 copy".
    chunk_prefix: str = "int64 copy"
    # RadixCache.cache_finished_req, paged: free the unaligned tail "first" or "last".
    finished_tail_free: str = "first"
    # How Req.is_prefill_only (max_new_tokens == 0 and no speculative decoding) reads the global
    # speculative algorithm:
    #   "dict is None": global_server_args_dict["speculative_algorithm"] is None. A real 0.5.3
    #       server's ModelRunner stores SpeculativeAlgorithm.NONE there, so no request is ever
    #       prefill-only in 0.5.3 (its logprob_start_len is then len - 1, not len);
    #   "dict None or NONE": the same dict, None or SpeculativeAlgorithm.NONE (0.5.3.post1);
    #   "server_args is None": get_global_server_args().speculative_algorithm is None (the
    #       ServerArgs string field, None without speculative decoding).
    prefill_only_spec_check: str = "server_args is None"
    # Req.reset_for_retract sets req_pool_idx = None (0.5.4 no longer does: a retracted request
    # keeps the index of the row it gave back until its next prepare_for_extend).
    retract_clears_req_pool_idx: bool = True
    oom_messages: dict[str, str] = field(default_factory=lambda: dict(_OOM_SCHEDULE_BATCH))

    @property
    def prefill_only_possible(self) -> bool:
        """Whether a real server of this version ever treats a request as prefill-only."""
        return self.prefill_only_spec_check != "dict is None"

    @property
    def label(self) -> str:
        return f"sglang-{self.version}"

    def oom_kind(self, message: str) -> str | None:
        """Which of SGLang's out-of-memory errors ``message`` is (a key of ``oom_messages``), or None."""
        for kind, start in self.oom_messages.items():
            if message.startswith(start):
                return kind
        return None


SUPPORTED: dict[str, VersionEntry] = {
    e.version: e
    for e in (
        VersionEntry(
            version="0.5.3",
            family="legacy",
            write_cache_indices=None,
            get_last_loc=f"{_SB}:get_last_loc",
            alloc_extend_caller=f"{_SB}:ScheduleBatch.alloc_paged_token_slots_extend",
            globals_style="dict",
            globals_target=f"{_SB}:global_server_args_dict",
            prefix_default="list",
            chunk_prefix="int32 view",
            prefill_only_spec_check="dict is None",
        ),
        VersionEntry(
            version="0.5.3.post1",
            family="refactored",
            write_cache_indices=f"{_SB}:ScheduleBatch.write_cache_indices",
            get_last_loc=f"{_SB}:get_last_loc",
            alloc_extend_caller=f"{_SB}:ScheduleBatch.alloc_paged_token_slots_extend",
            globals_style="dict",
            globals_target=f"{_SB}:global_server_args_dict",
            prefill_only_spec_check="dict None or NONE",
        ),
        VersionEntry(
            version="0.5.3.post2",
            family="refactored",
            write_cache_indices=f"{_COMMON}:write_cache_indices",
            get_last_loc=f"{_COMMON}:get_last_loc",
            alloc_extend_caller=f"{_COMMON}:alloc_paged_token_slots_extend",
            globals_style="server_args",
            globals_target=f"{_SERVER_ARGS}:set_global_server_args_for_scheduler",
            release_req_kind="cache_finished_req_no_insert",
            retract_decode_steps="sglang.srt.environ:envs.SGLANG_RETRACT_DECODE_STEPS",
            finished_tail_free="last",
            oom_messages=dict(_OOM_COMMON),
        ),
        VersionEntry(
            version="0.5.4",
            family="refactored",
            write_cache_indices=f"{_COMMON}:write_cache_indices",
            get_last_loc=f"{_COMMON}:get_last_loc",
            alloc_extend_caller=f"{_COMMON}:alloc_paged_token_slots_extend",
            globals_style="server_args",
            globals_target=f"{_SERVER_ARGS}:set_global_server_args_for_scheduler",
            release_req_kind="cache_finished_req_no_insert",
            retract_decode_steps="sglang.srt.environ:envs.SGLANG_RETRACT_DECODE_STEPS",
            finished_tail_free="last",
            retract_clears_req_pool_idx=False,
            oom_messages=dict(_OOM_COMMON),
        ),
    )
}

# A PEP 440 release as SGLang publishes them: N.N.N[.postN], optionally rcN / .devN.
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?$")


def parse_version(text: str) -> str:
    """``"0.5.3"``, ``"sglang==0.5.3"`` or ``" v0.5.3.post1 "`` -> the bare version string.
    Raises RealSGLangError for anything else."""
    raw = text.strip()
    bare = raw[len("sglang=="):].strip() if raw.lower().startswith("sglang==") else raw
    if bare[:1] in ("v", "V"):
        bare = bare[1:]
    if not _VERSION_RE.match(bare):
        raise RealSGLangError(
            f"{text!r} is not an SGLang version: expected a release such as 0.5.3 or "
            f"sglang==0.5.3.post1, or a path to a folder holding the sglang package"
        )
    return bare


def version_key(version: str) -> tuple[int, ...]:
    """Sort key: releases in PEP 440 order (dev < a < b < rc < final < post) for the forms above."""
    m = _VERSION_RE.match(version)
    if m is None:
        raise RealSGLangError(f"{version!r} is not an SGLang version")
    major, minor, micro, pre_kind, pre_num, post, dev = m.groups()
    phase = {"a": -3, "b": -2, "rc": -1, None: 0}[pre_kind]
    if pre_kind is None and post is None and dev is not None:
        phase = -4  # 1.0.0.dev1 sorts before 1.0.0a1
    return (
        int(major), int(minor), int(micro), phase, int(pre_num or 0),
        int(post) if post is not None else -1, int(dev) if dev is not None else 1 << 30,
    )


def nearest_supported(version: str) -> str:
    """The supported version closest to ``version``: one sharing its N.N.N release if any (the
    latest of them below it, else the earliest above), else the neighbour below it in release
    order (the earliest supported one when it is older than all)."""
    key = version_key(version)
    ordered = sorted(SUPPORTED, key=version_key)
    same_release = [v for v in ordered if version_key(v)[:3] == key[:3]]
    pool = same_release or ordered
    below = [v for v in pool if version_key(v) < key]
    return below[-1] if below else pool[0]


def entry(version: str) -> VersionEntry:
    """The adapter entry of ``version`` (any form ``parse_version`` accepts); an unsupported version
    is refused with a RealSGLangError naming the nearest supported one."""
    bare = parse_version(version)
    if bare in SUPPORTED:
        return SUPPORTED[bare]
    near = nearest_supported(bare)
    raise RealSGLangError(
        f"SGLang {bare} is not supported by kvparity's real-SGLang adapter (supported: "
        f"{', '.join(sorted(SUPPORTED, key=version_key))}); the nearest supported version is {near}"
    )

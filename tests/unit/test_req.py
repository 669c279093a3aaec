"""``Req``: the match key of ``init_next_round_input`` (SPEC section 2), the server's
``logprob_start_len`` rule, and what each version's defaults are."""

from __future__ import annotations

import pytest
import torch

from kvparity import legacy, refactored
from kvparity.engine.world import build_world
from kvparity.kernels.runtime import DEVICE
from kvparity.mem_cache.radix_cache import RadixKey
from kvparity.model.worlds import VERSIONS, Geometry

PROMPT = [10, 11, 12, 13, 14, 15]


def cached_world(version: str):
    """A radix cache already holding all of PROMPT, at slots 21..26."""
    world = build_world(version, "torch", Geometry(4, 16, 32), "radix")
    world.tree_cache.insert(RadixKey(PROMPT), torch.arange(21, 27, dtype=torch.int64, device=DEVICE))
    return world


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "tokens,kwargs,expected_prefix_len",
    [
        # logprobs off: everything but the last token may come from the cache
        (PROMPT, {}, 5),
        # logprob_start_len below the cached prefix: nothing from position 2 on is cached
        (PROMPT, {"return_logprob": True, "logprob_start_len": 2}, 2),
        (PROMPT, {"return_logprob": True, "logprob_start_len": 0}, 0),
        # the server turns -1 into len - 1, and clamps larger values to len - 1
        (PROMPT, {"return_logprob": True, "logprob_start_len": -1}, 5),
        (PROMPT, {"return_logprob": True, "logprob_start_len": 100}, 5),
        # a one-token input has nothing to take from the cache
        ([10], {}, 0),
    ],
    ids=["logprobs-off", "start-below-prefix", "start-0", "start-minus-1", "start-beyond", "one-token"],
)
def test_match_key(version, tokens, kwargs, expected_prefix_len):
    world = cached_world(version)
    req = world.new_req("r", tokens, **kwargs)
    req.init_next_round_input(world.tree_cache)
    assert req.fill_ids == tokens
    assert req.prefix_indices.tolist() == list(range(21, 21 + expected_prefix_len))
    assert req.prefix_indices.dtype == torch.int64
    assert req.last_matched_prefix_len == expected_prefix_len
    assert req.extend_input_len == len(tokens) - expected_prefix_len


@pytest.mark.parametrize("version", VERSIONS)
def test_output_tokens_join_the_key(version):
    world = cached_world(version)
    req = world.new_req("r", PROMPT[:4])
    req.output_ids = PROMPT[4:]  # e.g. a retracted request coming back with 2 generated tokens
    req.init_next_round_input(world.tree_cache)
    assert req.fill_ids == PROMPT
    assert req.prefix_indices.tolist() == [21, 22, 23, 24, 25]
    assert req.extend_input_len == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_input(version):
    world = cached_world(version)
    req = world.new_req("r", [])
    assert req.logprob_start_len == -1
    req.init_next_round_input(world.tree_cache)
    assert req.fill_ids == [] and len(req.prefix_indices) == 0 and req.extend_input_len == 0


def test_server_logprob_start_len_rejects_below_minus_one():
    with pytest.raises(ValueError, match="logprob_start_len=-2"):
        legacy.Req("r", [1, 2], return_logprob=True, logprob_start_len=-2)


def test_prefix_indices_defaults_differ_by_version():
    old, new = legacy.Req("r", [1, 2, 3]), refactored.Req("r", [1, 2, 3])
    assert old.prefix_indices == []
    assert isinstance(new.prefix_indices, torch.Tensor)
    assert new.prefix_indices.dtype == torch.int64 and new.prefix_indices.shape == (0,)
    assert new.prefix_indices.device.type == "cpu"


def test_adjust_max_prefix_ids_exists_only_in_legacy():
    req = legacy.Req("r", [1, 2, 3], return_logprob=True, logprob_start_len=1)
    assert req.adjust_max_prefix_ids() == [1]
    assert not hasattr(refactored.Req("r", [1, 2, 3]), "adjust_max_prefix_ids")


@pytest.mark.parametrize("version", VERSIONS)
def test_without_cache_the_prefix_is_kept(version):
    """A chunked request calls init_next_round_input() without the cache: the prefix that
    cache_unfinished_req gave it stays, and extend_input_len is the rest."""
    world = build_world(version, "torch", Geometry(4, 16, 32), "chunk")
    req = world.new_req("r", PROMPT)
    req.prefix_indices = torch.tensor([7, 8, 9], dtype=torch.int64)
    req.init_next_round_input()
    assert req.prefix_indices.tolist() == [7, 8, 9] and req.extend_input_len == 3


@pytest.mark.parametrize("module", [legacy, refactored], ids=VERSIONS)
def test_reset_for_retract(module):
    req = module.Req("r", PROMPT)
    req.prefix_indices = torch.tensor([1, 2], dtype=torch.int64)
    req.req_pool_idx, req.extend_input_len, req.already_computed, req.extend_logprob_start_len = 3, 4, 6, 2
    req.last_node = object()
    req.reset_for_retract()
    assert (req.req_pool_idx, req.last_node, req.extend_input_len) == (None, None, 0)
    assert (req.already_computed, req.extend_logprob_start_len, req.is_retracted) == (0, 0, True)
    default = module.Req("x", [1]).prefix_indices
    assert type(req.prefix_indices) is type(default) and len(req.prefix_indices) == 0

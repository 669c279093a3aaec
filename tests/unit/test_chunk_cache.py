"""The one place the two versions' caches differ (SPEC section 1): what the chunk cache's
``cache_unfinished_req`` hands out as the chunked request's prefix."""

from __future__ import annotations

import pytest
import torch

from kvparity.engine.world import build_world
from kvparity.model.worlds import Geometry

GEOMETRY = Geometry(pool_rows=2, max_context_len=8, kv_slots=16)


def chunked_request(version: str):
    """r0 (6 tokens) prefilled for 3 of them, then cached as unfinished: prefix = row 0 [0, 3)."""
    world = build_world(version, "torch", GEOMETRY, "chunk")
    req = world.new_req("r0", [5, 6, 7, 8, 9, 10])
    req.init_next_round_input(world.tree_cache)
    req.fill_ids, req.extend_input_len = req.fill_ids[:3], 3
    world.batch([req]).prepare_for_extend()  # row 0 = 1, 2, 3
    world.tree_cache.cache_unfinished_req(req)
    return world, req


def test_match_prefix_is_an_empty_int64_cpu_tensor():
    world = build_world("refactored", "torch", GEOMETRY, "chunk")
    prefix, node = world.tree_cache.match_prefix(None)
    assert prefix.dtype == torch.int64 and prefix.shape == (0,) and prefix.device.type == "cpu"
    assert node is None


def test_legacy_prefix_is_an_int32_view_of_the_row():
    world, req = chunked_request("legacy")
    row = world.req_to_token_pool.req_to_token
    assert req.prefix_indices.dtype == torch.int32
    assert req.prefix_indices.tolist() == [1, 2, 3]
    row[0, 1] = 77  # e.g. the row was freed and another request wrote into it
    assert req.prefix_indices.tolist() == [1, 77, 3]


def test_refactored_prefix_is_an_int64_copy():
    world, req = chunked_request("refactored")
    row = world.req_to_token_pool.req_to_token
    assert req.prefix_indices.dtype == torch.int64 and req.prefix_indices.is_contiguous()
    assert req.prefix_indices.tolist() == [1, 2, 3]
    row[0, 1] = 77
    assert req.prefix_indices.tolist() == [1, 2, 3]


@pytest.mark.parametrize("version", ["legacy", "refactored"])
def test_cache_finished_req_frees_row_and_slots(version):
    world, req = chunked_request(version)
    world.req_to_token_pool.free(req.req_pool_idx)
    req.init_next_round_input()
    world.batch([req]).prepare_for_extend()  # row 1 = 1, 2, 3 (prefix) + 4, 5, 6
    req.output_ids = [42]  # the sampled token has no slot
    world.tree_cache.cache_finished_req(req)
    assert world.req_to_token_pool.free_slots == [0, 1]
    assert world.allocator.free_pages.tolist() == list(range(7, 17)) + [1, 2, 3, 4, 5, 6]

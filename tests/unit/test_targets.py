"""The plug-in targets' registry (``kvparity.candidate.targets``): every record is whole and its parts fit
together, an unknown name is refused naming the known ones, and every error input is refused
with exactly its violation (before any candidate is loaded)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvparity.candidate.check import replay_batch
from kvparity.candidate.inputs import KernelBatch, candidate_args, contract_violations, materialise, reference_effect
from kvparity.candidate.loader import SIGNATURES
from kvparity.candidate.targets import CHECK_TARGETS, REGISTRY, TARGETS, WHOLE_PATH, Target, lookup
from kvparity.model.contract import ContractError

CPU = torch.device("cpu")
# One small valid batch per target, by hand.
SMALL = {
    "write_cache_indices": KernelBatch("write_cache_indices", rows=(1, 0), prefixes=((7,), ()), seq_lens=(3, 1),
                                       pool_rows=2, width=4, out_cache_loc=(1, 2, 3)),
    "get_last_loc": KernelBatch("get_last_loc", rows=(1, 0), prefixes=((7, 8), ()), seq_lens=(3, 1), pool_rows=2,
                                width=4),
    "alloc_extend": KernelBatch("alloc_extend", rows=(0, 1), prefixes=((5,), ()), seq_lens=(3, 1), pool_rows=2,
                                width=4, page_size=2, free_pages=(4, 6, 9)),
}


def test_the_registry_lists_every_target_once_and_the_command_line_takes_them() -> None:
    assert TARGETS == ("write_cache_indices", "get_last_loc", "alloc_extend") == tuple(SMALL)
    assert CHECK_TARGETS == (WHOLE_PATH, *TARGETS) and WHOLE_PATH not in REGISTRY
    assert SIGNATURES == {name: t.signature for name, t in REGISTRY.items()}


@pytest.mark.parametrize("name", TARGETS)
def test_every_record_has_every_field_and_they_fit_together(name: str) -> None:
    target = REGISTRY[name]
    assert target.name == name and lookup(name) is target
    for f in dataclasses.fields(Target):
        value = getattr(target, f.name)
        assert value is not None or f.name in ("table", "column_block_note"), f"{name}: {f.name} is not set"
    assert target.signature and target.error_inputs and target.request_block > 0
    batch = SMALL[name]
    assert contract_violations(batch) == []
    args, kwargs = candidate_args(materialise(batch, CPU))
    assert len(args) == len(target.signature) and kwargs == {}  # SGLang's call, positionally
    effect = reference_effect(batch, CPU)
    assert (effect.returned is None) == (target.returns == "ignored")
    assert target.interpreter_cost(batch) >= 0


def test_an_unknown_target_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        lookup("write_cache")
    assert str(raised.value) == ("target 'write_cache' is not one of "
                                 "('write_cache_indices', 'get_last_loc', 'alloc_extend')")
    with pytest.raises(ValueError, match="is not one of"):
        _ = KernelBatch("write_cache", rows=(0,), prefixes=((),), seq_lens=(1,), pool_rows=1, width=1).spec


@pytest.mark.parametrize("name, error", [(n, e) for n in TARGETS for e in REGISTRY[n].error_inputs],
                         ids=[f"{n}: {e.what}" for n in TARGETS for e in REGISTRY[n].error_inputs])
def test_every_error_input_is_refused_with_its_violation_before_a_candidate_loads(name: str, error) -> None:
    batch = KernelBatch(name, **error.fields)
    assert contract_violations(batch) == [error.violation]
    with pytest.raises(ContractError, match="breaks SPEC section 8"):
        replay_batch(name, "no.such.module:never_loaded", batch.to_json())

"""What kvparity knows of one SGLang release is one row of the release registry
(``kvparity.engine.releases``): its adapter entry's changed fields, the scheduler shell adapter that
first drives it, the generation it begins, its named changes and the differences the judge excuses
by name. Every other table is read from the rows."""

from __future__ import annotations

from kvparity.engine.real.shell_adapters import SHELLS, adapter_for
from kvparity.engine.real.versions import SUPPORTED
from kvparity.engine.release_order import version_key
from kvparity.engine.releases import (
    CHANGES,
    KNOWN_VERSION_DIFFERENCES,
    RELEASES,
    SCHEDULER_GENERATIONS,
    changes_between,
    release,
)


def test_a_release_row_holds_its_entry_facts_its_changes_and_what_the_judge_excuses():
    """0.5.10's row: the scheduler frees a refused Mamba request's state (an entry fact), the named
    change that says so and how kvparity's adapter undoes it; 0.5.4's row: the known difference."""
    row = release("sglang==0.5.10")
    assert dict(row.entry) == {"mamba_refusal_frees": True}
    assert (SUPPORTED["0.5.9"].mamba_refusal_frees, SUPPORTED["0.5.10"].mamba_refusal_frees) == (False, True)
    refusal = next(c for c in row.changes if c.adapter_undo)
    assert (refusal.release, refusal.pull_request, refusal.adapter_undo) == ("0.5.10", "#21404",
                                                                           ("mamba_refusal_frees", False))
    assert refusal in changes_between("0.5.9", "0.5.10") and refusal not in changes_between("0.5.10", "0.5.11")
    assert KNOWN_VERSION_DIFFERENCES["0.5.4 keeps req_pool_idx after retract"][0] == "0.5.4"


def test_the_rows_are_in_release_order_and_each_change_carries_its_row_s_release():
    versions = [r.version for r in RELEASES]
    assert versions == sorted(versions, key=version_key) and len(set(versions)) == len(versions)
    assert list(SUPPORTED) == versions
    assert [c.release for c in CHANGES] == [r.version for r in RELEASES for _ in r.changes]


def test_every_shell_adapter_is_named_by_one_row_and_every_generation_begins_with_one():
    named = [r.shell for r in RELEASES if r.shell is not None]
    assert sorted(named) == sorted(SHELLS) and len(set(named)) == len(named)
    for generation, (first, _) in SCHEDULER_GENERATIONS.items():
        assert release(first).shell is not None, generation
        assert (adapter_for(SUPPORTED[first]).name, adapter_for(SUPPORTED[first]).generation) == (first, generation)
    assert adapter_for(SUPPORTED["0.5.12.post1"]).name == "0.5.11"  # the newest row at or before it naming one

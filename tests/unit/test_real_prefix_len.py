"""The 0.5.22+ generation (``kvparity/engine/real/adapter_prefix_len.py``) and the two radix-tree
cores can fail: a copy of real 0.5.22 with one line broken is caught, by the comparison with the
release and by the comparison of its Python tree core with its Rust one.

The copies are checkout-shaped folders (``checkout_cases``) of the installed release; the tests
skip, saying so, where it is not installed.
"""

from __future__ import annotations

from kvparity.engine.real import install
from kvparity.engine.real.lane import RealLane
from kvparity.golden.scenarios import GOLDENS
from kvparity.run.runner import run_scenario
from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME

from checkout_cases import _checkout, _edit, _release

RELEASE = "0.5.22"


def _play(golden: str, specs: list, backends: tuple[str, ...] = ("torch",)):
    with RealLane(specs, backends) as lane:
        return run_scenario(GOLDENS[golden], (("refactored", "torch"),), lane=lane, real_reference=True)


def _mutated(name: str, tmp_path):
    """A checkout-shaped copy of the release with the real zoo's edit ``name`` applied."""
    mutant = REAL_MUTANTS_BY_NAME[name]
    copy = _checkout(mutant.version, tmp_path)
    _edit(copy / mutant.path, mutant.old, mutant.new)
    return copy


def test_the_release_against_itself_is_parity(tmp_path):
    copy = _checkout(RELEASE, tmp_path)  # the same code, named otherwise: nothing may differ
    result = _play("chunked-radix-cache", [install.resolve(str(_release(RELEASE))), str(copy)])
    assert result.ok, [d.line() for d in result.divergences]


def test_a_chunked_prefix_read_one_column_off_is_caught(tmp_path):
    # A request that holds its row reads its prefix from it (allocation._prefix_kv_indices).
    copy = _mutated("held-prefix-one-column-off", tmp_path)
    result = _play("chunked-radix-cache", [install.resolve(str(_release(RELEASE))), str(copy)])
    assert result.divergences, "the broken copy gave parity"
    assert all(d.world.startswith(f"{tmp_path.name}@{RELEASE}/") for d in result.divergences)


def test_a_python_tree_core_that_locks_too_little_is_caught_against_the_rust_core(tmp_path):
    # The Python core's FULL component locks the path from the node up to the root; this copy
    # stops below the root's child. The Rust core (the reference world) is untouched.
    copy = _mutated("python-tree-locks-short", tmp_path)
    result = _play("running-prompt-matched", [str(copy)])
    assert result.divergences, "the Python core's broken lock gave parity with the Rust core"
    assert {d.world for d in result.divergences} == {f"{tmp_path.name}@{RELEASE}/torch+python-tree"}


def test_the_scheduler_drive_plays_the_python_tree_core_where_both_releases_ship_two(release_workers):
    """``ServerConfig.tree_core="python"``: SGLang's own scheduler runs on the Python radix-tree core
    (the fallback a 0.5.21+ server ships beside its Rust default); a release with one core refuses
    it by name. Where both releases ship both, the strategy gives a stable half of the scenarios
    (prompts of an odd token count) the Python core."""
    import pytest
    from hypothesis import given, settings

    from kvparity.engine.real.worker import RemoteError
    from kvparity.engine.traffic_run import TrafficRun
    from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario
    from kvparity.model.traffic_strategies import traffic_scenarios

    def tree(release: str, core: str | None) -> str:
        config, arrivals = TrafficScenario(ServerConfig(tree_core=core), ((Arrival("a", (1, 2, 3), 2),),)).to_plain()
        return TrafficRun.from_plain(release_workers(release).call("run_traffic", config=config,
                                                                   arrivals=arrivals)).player["tree"]

    assert (tree("0.5.22", None), tree("0.5.22", "python")) == ("unified/rust", "unified/python")
    with pytest.raises(RemoteError, match="tree_core='python': SGLang 0.5.3 has one core"):
        tree("0.5.3", "python")

    @settings(max_examples=20, derandomize=True, database=None)
    @given(traffic_scenarios(two_cores=True))
    def halves(scenario: TrafficScenario) -> None:
        odd = sum(len(a.tokens) for group in scenario.arrivals for a in group) % 2
        assert scenario.config.tree_core == ("python" if odd else None)

    halves()

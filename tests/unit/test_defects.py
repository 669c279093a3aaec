"""A defect is a failure (issue 48): what a release's own run breaks (an oracle, a read of wrong KV,
SGLang raising) fails the check even where the reference's run breaks alike; a defect SGLang is
known to have is named from the registry (``kvparity.engine.real.defects``). On hand-built runs:
no scheduler is played here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvparity.engine.real.defects import KNOWN_DEFECTS, known_defect
from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.verdict import Row, Verdict, to_json
from kvparity.model.cache_configs import MAMBA_SLOTS_PER_REQUEST
from kvparity.model.classes import TRAFFIC_REQUIRED
from kvparity.model.traffic import Arrival, HostOffer, ServerConfig, TrafficScenario
from kvparity.model.traffic_records import TABLE_ONLY, WRONG_KV, Decision, InflightFinding, StopError
from kvparity.model.worlds import WorldId
from kvparity.run.scheduler_drive import PlayerSpec, SchedulerDrive, SchedulerSpec

WORLD = WorldId.modelled("legacy", "torch")
SCENARIO = TrafficScenario(ServerConfig(), ((Arrival("a", (1, 2), 1),),))
LEAK = StopError(1, "ValueError: token_to_kv_pool_allocator memory leak detected!", "sglang/srt/x.py:1 in check",
                 "Traceback (most recent call last):\n  ...\nValueError: token_to_kv_pool_allocator memory leak detected!")


def run(*, error=None, inflight=()):
    return TrafficRun("normal", (Decision(0, "EXTEND", ("a",), (0,), (2,)),), (), {}, tuple(inflight), error)


@pytest.fixture
def drive():
    players = tuple(SimpleNamespace(name=f"sglang-{release} (SGLang's own scheduler)", release=release,
                                    loops=("normal",), caches=("full",), paged_windows=False, host_offer=HostOffer(), tree_cores=(),
                                    world_id=WORLD) for release in ("0.5.9", "0.5.9"))
    drive = SchedulerDrive(SchedulerSpec(PlayerSpec("real", "0.5.9"), PlayerSpec("real", "0.5.9"), ("fcfs",),
                                         ("normal",)), players=players)
    yield drive
    drive.close()


def verdict_of(drive, played) -> Verdict:
    row = Row("fcfs, normal loop", (0, 0))
    row.count(played, row.task)
    return Verdict("scheduler", drive.reference, drive.checked, [row], TRAFFIC_REQUIRED, counts_all=True)


def test_a_defect_both_runs_share_fails_the_check(drive):
    """Both runs raise alike: they agree, yet the verdict is a defect, not parity."""
    played = drive.judged(SCENARIO, (run(error=LEAK), run(error=LEAK)), drive.checked_player)
    assert played.agree
    assert [f.label.split(": ", 1)[1] for f in played.defects] == ["the scheduler raised"] * 2
    assert played.defects[0].detail == LEAK.traceback  # the traceback travels with it
    verdict = verdict_of(drive, played)
    assert (verdict.rows[0].verdict, verdict.verdict, verdict.defective) == ("defect", "defect", 1)
    assert drive.summary(verdict).startswith("DEFECT: the scheduler raised in sglang-0.5.9")
    assert to_json(verdict, drive)["verdict"] == "defect"


def test_a_finding_is_counted_as_known_only_where_the_release_is_known_to_have_it(drive):
    """Two scenarios whose runs raise, one with SGLang's known Mamba leak (0.5.9), one with another
    error: two groups, each labelled by what its own scenarios met, whichever was met first."""
    mamba = TrafficScenario(ServerConfig(mamba_slots=MAMBA_SLOTS_PER_REQUEST * 8), SCENARIO.arrivals)
    leak = StopError(1, "ValueError: memory leak detected! mamba_available_size=3, leaked_mamba_pages={6}")
    other = StopError(1, "AssertionError: deep in the host tier")
    row = Row("fcfs, normal loop", (0, 0))
    for error in (leak, other, leak):
        row.count(drive.judged(mamba, (run(error=error), run(error=error)), drive.checked_player), row.task)
    verdict = Verdict("scheduler", drive.reference, drive.checked, [row], TRAFFIC_REQUIRED, counts_all=True)
    raised = "sglang-0.5.9 (SGLang's own scheduler): the scheduler raised"
    assert {label: f.known and f.known.name for label, f in verdict.defects.items()} == {
        raised: None, f"{raised} (Mamba state leaked by a refused request)": "Mamba state leaked by a refused request"}
    assert verdict.findings == {raised: 1, f"{raised} (Mamba state leaked by a refused request)": 2}
    assert to_json(verdict, drive)["findings"][raised]["line"] == "iteration 1: AssertionError: deep in the host tier"


def test_an_in_flight_table_change_over_the_same_kv_is_no_defect_a_read_of_wrong_kv_is(drive):
    """A live cell rewritten to the tree's duplicate slot while its batch is in flight reads the
    same KV (every release does it): reported, not a defect. A finished request's row given away
    under its batch in flight is read as wrong KV: a defect, though SGLang drops that token."""
    same_kv = InflightFinding("cell", "live", TABLE_ONLY, 0, "a", 1, 1, "run_batch", (0,), (2,), (1,))
    played = drive.judged(SCENARIO, (run(inflight=[same_kv]), run(inflight=[same_kv])), drive.checked_player)
    assert played.findings and not played.defects
    assert verdict_of(drive, played).verdict == "parity"
    wrong = InflightFinding("row", "finished", WRONG_KV, 0, "a", 1, 1, "get_next_batch_to_run", taken_by="b")
    played = drive.judged(SCENARIO, (run(inflight=[wrong]), run(inflight=[wrong])), drive.checked_player)
    assert played.agree and len(played.defects) == 2
    assert verdict_of(drive, played).verdict == "defect"


def test_a_crash_reads_as_an_error_not_as_a_count_of_iterations(drive):
    """The checked run raised where the reference did not: the error is the symptom shown."""
    shorter = TrafficRun("normal", (), (), {}, (), StopError(0, "AssertionError: deep in the host tier"))
    played = drive.judged(SCENARIO, (run(), shorter), drive.checked_player)
    assert played.kind == "error" and "AssertionError: deep in the host tier" in played.line
    reference_raised = drive.judged(SCENARIO, (shorter, run()), drive.checked_player)
    assert reference_raised.kind == "error" and "the reference's scheduler raised" in reference_raised.line


# A server of each model a known defect names (a window of 6 on pages of 4: not whole pages).
SERVERS = {"full": ServerConfig(), "mamba": ServerConfig(mamba_slots=MAMBA_SLOTS_PER_REQUEST * 8),
           "swa": ServerConfig(page_size=4, sliding_window=6),
           "hicache": ServerConfig(hicache_ratio=2.0, hicache_write_policy="write_back", hicache_storage=True),
           "hicache-mamba": ServerConfig(mamba_slots=MAMBA_SLOTS_PER_REQUEST * 8, hicache_ratio=2.0,
                                         hicache_write_policy="write_back", hicache_storage=True)}


def test_every_known_defect_names_its_evidence_and_matches_only_its_releases():
    for defect in KNOWN_DEFECTS:
        assert defect.evidence and defect.what and defect.says
        line = " ".join(defect.says)
        config = SERVERS[defect.cache or "full"]
        assert known_defect(defect.first, config, defect.shows, line) is not None
        assert known_defect("0.5.2", config, defect.shows, line) is None


def test_a_known_defect_of_some_servers_is_not_named_on_others():
    """0.5.18 to 0.5.22 free window pages still in use where the window is not a whole number of
    pages: a window of 6 on pages of 4 meets it, one of 8 (two pages) does not."""
    line = "iteration 1: slots conserved: pages both free and held: [1, 2]"
    assert known_defect("0.5.19", SERVERS["swa"], "memory oracle: slots conserved", line).name == \
        "window margin not whole pages"
    whole = ServerConfig(page_size=4, sliding_window=8)
    assert known_defect("0.5.19", whole, "memory oracle: slots conserved", line) is None
    assert known_defect("0.5.23", SERVERS["swa"], "memory oracle: slots conserved", line) is None

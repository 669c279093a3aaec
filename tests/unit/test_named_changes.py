"""A difference between two releases traced to a named change (``kvparity.engine.releases``):
undone in a copy of the release that made it, the replay no longer differs. 0.5.23 stops a prefill
pass before matching the next waiting request once the pass's budget is spent, so the node split
that request's match made in 0.5.22 is not made: the same slots, one node fewer."""

from __future__ import annotations

from kvparity.engine.releases import CHANGES, changes_between
from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario

STOP_BEFORE_MATCH = next(c for c in CHANGES if c.release == "0.5.23" and "budget is spent" in c.what)


def spent_budget() -> TrafficScenario:
    """``c1`` (21 tokens) prefills in chunks of 12 under a budget of 16; ``c2`` (c1's first 5)
    waits while the second chunk spends the pass."""
    config = ServerConfig(page_size=4, kv_slots=1024, max_prefill_tokens=16, chunked_prefill_size=12)
    c1 = tuple(range(100000, 100021))
    return TrafficScenario(config, ((Arrival("c1", c1, 1),), (Arrival("c2", c1[:5], 1),)))


def test_every_named_change_that_says_how_to_undo_it_undoes_its_own_release_s_text():
    """An undo is a text the change wrote in its release, found once there (``copy_with_edits``
    refuses any other); 0.5.23's three are between 0.5.22 and it."""
    assert [c.what[:40] for c in changes_between("0.5.22", "0.5.23") if c.undo] == [
        "Scheduler.get_next_batch_to_run filters ", "the prefill pass stops before matching t",
        "the prefill pass's row budget counts the"]
    for change in (c for c in CHANGES if c.undo):
        path, wrote, before = change.undo
        text = (resolve_release(change.release) / path).read_text()
        assert text.count(wrote) == 1, (change.release, change.what[:40])


def resolve_release(release: str):
    from pathlib import Path

    from kvparity.engine.real.install import resolve

    return Path(resolve(release).path)


def test_0_5_23_s_spent_budget_stop_is_why_its_tree_has_a_node_fewer(release_workers):
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.judge.admission import judge_traffic

    older = RealTrafficPlayer(resolve("0.5.22"), release_workers("0.5.22"))
    newer = RealTrafficPlayer(resolve("0.5.23"), release_workers("0.5.23"))
    undone = newer.undone([STOP_BEFORE_MATCH])
    assert undone is not None
    scenario = spent_budget()
    try:
        theirs = older.play(scenario)
        differs = judge_traffic(scenario, theirs, newer.play(scenario), older.world_id, newer.world_id)
        same = judge_traffic(scenario, theirs, undone.play(scenario), older.world_id, undone.world_id)
    finally:
        undone.close()
    assert differs.kind == "memory" and "the tree has 2 nodes against the reference's 3" in differs.line()
    assert same.agree, same.line()

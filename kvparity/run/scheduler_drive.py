"""The scheduler drive: traffic scenarios (``kvparity.model.traffic``, drawn by
``kvparity.model.traffic_strategies``) played by two schedulers, a reference and a checked one
(``kvparity.engine.traffic_players``: a real release's own scheduler in a worker process through the
plugin ``kvparity.engine.real.scheduler_shell``, or kvparity's model of it), which decide everything
(admission, chunking, decoding, retraction) themselves. Every run is judged
(``kvparity.judge.admission``): the decisions iteration by iteration, the memory after every
iteration while the decisions agree, each run's memory oracles and KV canary, the in-flight findings,
the outputs. One task per schedule policy and event loop; every scenario is played and the
differing ones counted.

A difference's cause is named only where it is shown (``explain``): a difference of memory is the
first thing reported, before any decision it leads to; a decision difference with the same memory
before it is "a different rule", and a named change between the two releases
(``kvparity.engine.releases``) is its cause when undoing that one change in the checked player
makes the replay decide as the reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvparity import caches
from kvparity.engine.change import Change
from kvparity.engine.real.door import KnownDefect, RealTrafficPlayer, known_defect
from kvparity.engine.releases import changes_between
from kvparity.engine.traffic_players import ModelTrafficPlayer, TrafficPlayer
from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.admission import TrafficJudgement, judge_traffic, traffic_problems
from kvparity.judge.traffic_classes import rare_counts, traffic_classes
from kvparity.judge.verdict import Finding, Played, Verdict
from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.cache_configs import SlidingWindow
from kvparity.model.classes import (
    TRAFFIC_ABORTS,
    TRAFFIC_CHUNK_IN_FLIGHT_FREED,
    TRAFFIC_NEMESIS,
    TRAFFIC_PYTHON_CORE,
    TRAFFIC_REQUIRED,
    TRAFFIC_STORAGE_READ_FAULT,
    TRAFFIC_WINDOW_BELOW_PAGE,
    TRAFFIC_WINDOW_OFF_PAGE,
)
from kvparity.model.traffic import LOOPS, TrafficScenario, traffic_to_dict
from kvparity.model.traffic_records import WRONG_KV
from kvparity.model.traffic_strategies import ServeOptions, traffic_scenarios
from kvparity.run.candidates import traffic_candidates
from kvparity.run.drive import Task
from kvparity.run.minimize import DEFAULT_BUDGET_S
from kvparity.run.plan import shards

DEFAULT_TRAFFIC_EXAMPLES = 40  # per schedule policy and event loop
# The hybrid models' tasks: these policies only (fcfs: arrival order; lpm: the cache-aware ranking,
# whose prefix matches meet the window's tombstones).
HYBRID_POLICIES = ("fcfs", "lpm")
# The rare shape Hypothesis steers toward (``hypothesis.target``). Measured on the default check of
# 0.5.3.post1 against 0.5.3 (320 scenarios, 160 in the overlap loop), unsteered -> steered: rows
# freed under a chunk in flight 31 -> 87 of 160, retractions in the overlap loop 24 -> 60 of 160,
# retracted requests readmitted on a hit 42 -> 66 of 320 (the other two follow the first); the
# required classes stay reached (radix hits on running requests 256 -> 183 of 320). Steering toward
# all three at once lowered readmissions on a hit and every required class more.
STEERED = (TRAFFIC_CHUNK_IN_FLIGHT_FREED,)
# The abort states the nemesis steers toward: a request aborted between chunks or after its
# retraction (waiting and decoding are met by most drawn delays).
NEMESIS_STEERED = ("between chunks", "retracted")
# Scenarios per shard under the nemesis: Hypothesis spends a task's scenarios on variations of its
# first few, so a fault those few miss stays rare in the whole task; shards of 10, each from its own
# seed, start from four times as many.
NEMESIS_SHARD = 10


@dataclass(frozen=True)
class PlayerSpec:
    """A player as plain data: kvparity's model of a version ("model", "legacy") or a real SGLang
    ("real", a release or a folder, as ``--sglang`` takes it)."""

    kind: str
    name: str

    def build(self) -> TrafficPlayer:
        if self.kind == "model":
            return ModelTrafficPlayer(self.name)
        from kvparity.engine.real.door import resolve

        return RealTrafficPlayer(resolve(self.name))


def player_spec(player: Any) -> PlayerSpec:
    """The plain-data spec of a player (what a job process builds it from)."""
    player = getattr(player, "player", player)  # a CachingPlayer's own
    if isinstance(player, ModelTrafficPlayer):
        return PlayerSpec("model", player.version)
    source = player.source
    return PlayerSpec("real", source.path if source.origin == "path" else source.version)


@dataclass(frozen=True)
class SchedulerSpec:
    reference: PlayerSpec
    checked: PlayerSpec
    policies: tuple[str, ...] = POLICIES
    loops: tuple[str, ...] = LOOPS
    caches: tuple[str, ...] = ("full",)  # the cache kinds served (``kvparity.caches``): those both players serve are drawn
    # Play the checked release with its own named changes undone (those that say how,
    # ``kvparity.engine.releases``): parity then says the two differ by those changes alone.
    undo_changes: bool = False
    # The nemesis (issue 48): client aborts drawn into the scenarios, where both players take them.
    # Asked for by name for now: on by default it would change every real pair's drawn scenarios.
    nemesis: bool = False

    def build(self) -> SchedulerDrive:
        return SchedulerDrive(self)


def with_loop(scenario: TrafficScenario, loop: str) -> TrafficScenario:
    return dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, loop=loop))


class SchedulerDrive:
    name = "scheduler"
    counts_all = True
    required: tuple[str, ...] = TRAFFIC_REQUIRED
    # Shown by task, not required: the hybrid models' and the nemesis's.
    # The cache kinds' own shapes (each once, in the registry's order), the nemesis's, the Python core's.
    model_classes: tuple[str, ...] = caches.classes() + TRAFFIC_NEMESIS + (TRAFFIC_PYTHON_CORE,)

    def __init__(self, spec: SchedulerSpec, players: tuple[TrafficPlayer, TrafficPlayer] | None = None) -> None:
        """``players``: the caller's (reference, checked), closed by the caller; without them, the
        drive builds its own from ``spec`` and closes them."""
        self.spec = spec
        self.owns_players = players is None
        self.ref_player, self.checked_player = players or (spec.reference.build(), spec.checked.build())
        self.undone = self._undo_changes() if spec.undo_changes else ()
        self.reference = self.ref_player.name
        self.checked: tuple[str, ...] = (self.checked_player.name,)
        self.loops = tuple(loop for loop in spec.loops if loop in self.ref_player.loops and loop in self.checked_player.loops)
        self.caches = tuple(c for c in spec.caches if c in self.ref_player.caches and c in self.checked_player.caches)
        # A sliding-window model's pools take a page size only where both releases' do (0.5.8+).
        self.window_pages = (1, 4) if self.ref_player.paged_windows and self.checked_player.paged_windows else (1,)
        # A host tier both releases serve (a storage tier from 0.5.19; a small host pool from 0.5.15).
        self.host_offer = self.ref_player.host_offer.both(self.checked_player.host_offer)
        # Both radix-tree cores where both releases ship them (0.5.21+): each task plays the Python
        # core in half its scenarios beside the server's default, Rust.
        self.two_cores = all({"rust", "python"} <= set(p.tree_cores) for p in (self.ref_player, self.checked_player))
        # The nemesis's client aborts, where both players take them (real releases).
        self.nemesis = spec.nemesis and self.ref_player.aborts and self.checked_player.aborts
        # Its forced retraction, where both releases take SGLang's retraction test switch (0.5.4+).
        self.forced_retraction = self.nemesis and self.ref_player.forced_retraction and self.checked_player.forced_retraction
        self.pool = ThreadPoolExecutor(1)  # the reference plays beside the checked player (real ones are processes)

    def _undo_changes(self) -> tuple[Change, ...]:
        """Swap in the checked player with its release's named changes undone; the changes."""
        changes = tuple(c for c in changes_between(self.ref_player.release, self.checked_player.release)
                        if c.release == self.checked_player.release and (c.undo or c.model_undo))
        undone = self.checked_player.undone(changes) if changes else None
        if undone is None:
            raise ValueError(f"--undo-changes: {self.checked_player.name} has no named change kvparity can undo "
                             f"(changes of {self.checked_player.release} that say how, after {self.ref_player.release})")
        if self.owns_players:
            self.checked_player.close()
        self.checked_player, self.checked = undone, (undone.name,)
        return changes

    # ---- drawing ----------------------------------------------------------------------------------
    def tasks(self, examples: int, seed: int | None) -> list[Task]:
        """One task per loop both players play and per policy, ``examples`` scenarios each; for a
        hybrid model both serve, one per loop it is served in (its kind's ``loops``) and per policy of
        ``HYBRID_POLICIES`` (its pools change memory, not how the queue is ranked), after those of
        full attention."""
        size = NEMESIS_SHARD if self.nemesis else None
        full = [task for i, loop in enumerate(self.loops) if "full" in self.caches
                for j, policy in enumerate(self.spec.policies)
                for task in shards(f"{policy}, {loop} loop", (i, j), examples, seed, i * len(POLICIES) + j, size)]
        hybrid = [task for c, kind in enumerate(map(caches.get, self.caches)) if kind.hybrid
                  for i, loop in enumerate(self.loops) if loop in kind.loops
                  for j, policy in enumerate(self.spec.policies) if policy in HYBRID_POLICIES
                  for task in shards(f"{policy}, {loop} loop, {kind.label}", (i, j, kind.name), examples, seed,
                                     len(LOOPS) * len(POLICIES) * (c + 1) + i * len(POLICIES) + j, size)]
        return full + hybrid

    def strategy(self, task: Task) -> Any:
        loop, policy = self.loops[task.key[0]], self.spec.policies[task.key[1]]
        kind = caches.get(task.key[2]) if len(task.key) > 2 else None
        options = ServeOptions(self.window_pages, self.host_offer, self.nemesis)
        drawn = traffic_scenarios(policies=(policy,), kind=kind, options=options, two_cores=self.two_cores,
                                  forced_retraction=self.forced_retraction)
        return drawn.map(lambda scenario: with_loop(scenario, loop))

    # ---- playing and judging ----------------------------------------------------------------------
    def runs(self, scenario: TrafficScenario) -> tuple[TrafficRun, TrafficRun]:
        theirs = self.pool.submit(self.ref_player.play, scenario)
        ours = self.checked_player.play(scenario)
        return theirs.result(), ours

    def play(self, scenario: TrafficScenario) -> Played:
        return self.judged(scenario, self.runs(scenario), self.checked_player)

    def judged(self, scenario: TrafficScenario, runs: tuple[TrafficRun, TrafficRun], checked: TrafficPlayer) -> Played:
        judgement = judge_traffic(scenario, *runs, self.ref_player.world_id, checked.world_id)
        kind = None if judgement.agree else _kind(judgement)
        findings = _findings(self.ref_player, scenario, runs[0]) + _findings(checked, scenario, runs[1])
        return Played(scenario, judgement.agree, kind, "" if judgement.agree else judgement.line(),
                      frozenset(traffic_classes(scenario, runs[0])), findings, (runs, judgement))

    def replayer(self, played: Played) -> Callable[[TrafficScenario], Played]:
        return self.play

    def finding_replayer(self, finding: Finding) -> Callable[[TrafficScenario], Played]:
        """Only the player the finding was seen in plays (the other's findings are not needed)."""
        player = self.ref_player if finding.where == self.ref_player.name else self.checked_player

        def replay(scenario: TrafficScenario) -> Played:
            run = player.play(scenario)
            return Played(scenario, True, None, "", frozenset(), _findings(player, scenario, run), None)

        return replay

    def same(self, played: Played, first: Played) -> bool:
        """A candidate keeps the difference when its first symptom is of the same kind: an
        admission difference for an admission difference, the same decision field, ..."""
        if played.agree or played.kind != first.kind:
            return False
        mine, theirs = played.result[1], first.result[1]
        if first.kind == "decision" and theirs.decision is not None and mine.decision is not None:
            return mine.decision.field == theirs.decision.field
        return True

    def identical(self, played: Played, first: Played) -> bool:
        return self.same(played, first)

    def broken(self, played: Played) -> str | None:
        if played.kind == "error":
            return str(played.line)
        (_, run), _ = played.result
        if run.error is None:
            return None
        where = f" (at {run.error.where})" if run.error.where else ""  # explain learns B's version of that function
        return f"iteration {run.error.iteration}: the scheduler raised {run.error.message}{where}"

    def targets(self, played: Played) -> dict[str, float]:
        """The rare shapes (``TRAFFIC_RARE``) the reference's run met, counted: Hypothesis steers
        toward scenarios that meet them more often."""
        reference = played.result[0][0]
        counts = rare_counts(reference)
        steered = {name: float(counts[name]) for name in STEERED}
        if played.scenario.config.part(SlidingWindow) is not None:  # toward windows at odds with the page
            steered |= {name: float(name in played.classes) for name in (TRAFFIC_WINDOW_BELOW_PAGE, TRAFFIC_WINDOW_OFF_PAGE)}
        if self.nemesis:  # toward the abort states a drawn delay rarely meets, and failed storage reads
            states = [state for _, _, state in reference.aborts]
            steered |= {TRAFFIC_ABORTS[s]: float(states.count(s)) for s in NEMESIS_STEERED}
            host = reference.memory[-1].host if reference.memory else None
            steered[TRAFFIC_STORAGE_READ_FAULT] = float(host.read_faults if host else 0)
            # Only what the scenario met: a label no scenario has met has no best one to climb from,
            # and Hypothesis spent a third of a task's 40 on variations of a scenario with none.
            steered = {name: score for name, score in steered.items() if score > 0}
        return steered

    def candidates(self, scenario: TrafficScenario) -> Iterator[TrafficScenario]:
        return traffic_candidates(scenario)

    # ---- why ----------------------------------------------------------------------------------------
    def explain(self, played: Played) -> str | None:
        """What a difference comes from, where it can be shown. A memory symptom (a memory
        difference, a broken oracle, a read of wrong KV) is reported first, before any decision it
        leads to. For a decision difference: the memory before it (the same: "a different rule") and
        both players' accounting at that iteration. For either: a named change between the two,
        when undoing that one change in the checked player makes the difference go in a replay;
        else, for a decision under a ranking policy, whether the same traffic under fcfs (no
        ranking) decides alike."""
        (ref_run, our_run), judgement = played.result
        decided = played.kind in ("admission", "decision")
        if decided and judgement.decision is not None:
            at = judgement.decision.iteration
            parts = ["before it, none of the memory differs: the same memory, a different rule",
                     f"accounting at iteration {at}: reference {_accounting(ref_run, at)}; "
                     f"checked {_accounting(our_run, at)}"]
        elif not decided:
            later = "" if judgement.decision is None else \
                f"; the decisions differ only later ({judgement.decision.line()})"
            parts = [f"the memory differs first, under the same decisions{later}"]
        else:
            return None
        named = self._named_change(played)
        if named is not None:
            parts.append(f"cause: {named} (undone in {self.checked_player.name}, the replay no longer differs so)")
        elif decided and self._fcfs_agrees(played.scenario):
            parts.append(f"the waiting queue's ranking under {played.scenario.config.schedule_policy} differs (the "
                         "same traffic under fcfs decides alike); no named change was shown to cause it")
        elif not decided:
            parts.append("no named change was shown to cause it")
        return "\n".join(parts)

    def _named_change(self, played: Played) -> str | None:
        """The change between the two releases whose undoing (in the checked player) makes the
        replay of ``played``'s scenario lose its difference: decide alike for a decision, the same
        memory (nothing of the first symptom's kind) otherwise. A change ``--undo-changes`` undid
        already is not tried again (its text is gone from the copy)."""
        scenario = played.scenario
        for change in changes_between(self.ref_player.release, self.checked_player.release):
            if change in self.undone:
                continue
            player = self.checked_player.undone([change])
            if player is None:
                continue
            try:
                replayed = self.judged(scenario, (self.ref_player.play(scenario), player.play(scenario)), player)
            finally:
                player.close()
            judgement = replayed.result[1]
            gone = judgement.decision is None if played.kind in ("admission", "decision") else (
                replayed.agree or replayed.kind in ("admission", "decision", "outputs"))
            if gone:
                return change.what
        return None

    def _fcfs_agrees(self, scenario: TrafficScenario) -> bool:
        if scenario.config.schedule_policy == "fcfs":
            return False
        fcfs = dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, schedule_policy="fcfs"))
        return self.play(fcfs).agree

    def refuses(self, scenario: TrafficScenario) -> str | None:
        loop = scenario.config.loop
        if loop not in self.loops:
            player = self.ref_player if loop not in self.ref_player.loops else self.checked_player
            return f"the {loop} loop is not played by {player.name}"
        return None

    # ---- reporting --------------------------------------------------------------------------------
    def report(self, played: Played, replay: str | None = None) -> str:
        (ref_run, our_run), judgement = played.result
        lines = [f"kvparity: the schedulers differ: {judgement.line()}", ""]
        for what, items in (("memory oracles the checked run broke", judgement.problems),
                            ("reads of wrong KV only the checked run made", judgement.canary),
                            ("in-flight findings the reference lacks", judgement.inflight_only_other)):
            if items:
                lines += [f"{what}:"] + [f"  {item.line()}" for item in items[:6]] + [""]
        lines += ["scenario:", played.scenario.to_python()]
        if replay is not None:
            lines += ["", f"replay: {replay}"]
        return "\n".join(lines)

    def header(self, verdict: Verdict) -> list[str]:
        """One row per schedule policy and event loop: scenarios, how many differ, of what kind first."""
        lines = [f"scheduler-driven: {self.checked_player.name} against {self.reference} (reference)"]
        lines += [f"  undone (named finding, {c.kind}): {c.what}" for c in self.undone]
        lines.append(f"{'policy, loop':<34} {'scenarios':>9} {'differ':>7} {'defect':>7}  verdict")
        for row in verdict.rows:
            kinds = ", ".join(f"{k} {n}" for k, n in row.kinds.most_common())
            lines.append(f"{row.task:<34} {row.scenarios:>9} {row.differing:>7} {row.defective:>7}  "
                         f"{'parity' if row.verdict == 'parity' else row.verdict.upper()}"
                         + (f" ({kinds})" if kinds else ""))
        return lines

    def summary(self, verdict: Verdict) -> str:
        """What differs, by kind (each kind a row's differing scenarios showed first), under which
        policies (and loop, when only one), and the policies under which nothing does."""
        rows = [(self.spec.policies[r.key[1]] + (f" ({caches.get(r.key[2]).label})" if len(r.key) > 2 else ""),
                 self.loops[r.key[0]], r) for r in verdict.rows]
        policies = list(dict.fromkeys(p for p, _, _ in rows))
        if verdict.verdict == "parity":
            return "PARITY under " + ", ".join(policies)
        if verdict.verdict == "defect":
            return f"DEFECT: {_defects_part(verdict, [(p, r) for p, _, r in rows])} (in the runs' own; the two agree)"
        groups: dict[str, list[tuple[str, str]]] = {}
        for policy, loop, row in rows:
            for kind in sorted(row.kinds, key=lambda k: list(KIND_WORDS).index(k) if k in KIND_WORDS else 99):
                groups.setdefault(KIND_WORDS.get(kind, "decisions differ"), []).append((policy, loop))
        all_loops = {loop for _, loop, _ in rows}
        parts = []
        for what, where in groups.items():
            loops = list(dict.fromkeys(loop for _, loop in where))
            at = "" if set(loops) == all_loops else f" ({', '.join(loops)} loop)"
            parts.append(f"{what} under {', '.join(dict.fromkeys(p for p, _ in where))}{at}")
        same = [p for p in policies if all(r.verdict == "parity" for q, _, r in rows if q == p)]
        # The defects of the runs' own are listed above the verdict line (a divergence says enough here).
        return "DIVERGENCE: " + "; ".join(parts + (["parity under " + ", ".join(same)] if same else []))

    def finding_kind(self, label: str) -> str:
        return "found in a player's own runs"

    def size(self, scenario: TrafficScenario) -> str:
        requests = sum(len(group) for group in scenario.arrivals)
        aborts = sum(len(group) for group in scenario.aborts) + len(scenario.abort_when)
        return f"{requests} requests over {len(scenario.arrivals)} iterations" + (f", {aborts} aborted" if aborts else "")

    def to_dict(self, scenario: TrafficScenario) -> dict[str, Any]:
        return traffic_to_dict(scenario)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.owns_players:
            self.ref_player.close()
            self.checked_player.close()
        elif self.undone:  # the copy with the changes undone is the drive's own
            self.checked_player.close()


OWN_SCHEDULER = " (SGLang's own scheduler)"  # how a real player's name ends
KIND_WORDS = {"admission": "admission differs", "decision": "decisions differ",
              "inflight": "in-flight findings the reference lacks", "error": "the scheduler stopped on an error",
              "outputs": "outputs differ", "memory": "memory differs under the same decisions",
              "oracle": "memory oracles fail", "canary": "reads of wrong KV (canary)"}


def _defects_part(verdict: Verdict, rows: list[tuple[str, Any]]) -> str:
    """The defects of the players' own runs in words: what, whose, known or not, under which tasks."""
    defects = verdict.defects
    if not defects:
        return ""
    whats = []
    for finding in defects.values():
        known = f", known: {finding.known.name}" if finding.known else ""
        whats.append(f"{finding.kind} in {finding.where.removesuffix(OWN_SCHEDULER)}{known}")
    where = ", ".join(dict.fromkeys(p for p, r in rows if r.defective))
    return f"{'; '.join(dict.fromkeys(whats))}, under {where}"


def _kind(judgement: TrafficJudgement) -> str:
    kind = judgement.kind
    return "admission" if kind == "decision" and judgement.admission else kind


def _findings(player: TrafficPlayer, scenario: TrafficScenario, run: TrafficRun) -> tuple[Finding, ...]:
    """What one player's run found, per kind (a property of the player, whatever the other run
    found): in-flight findings by kind, class and harm, reads of wrong KV, memory oracles broken, an
    error it stopped on. Each is a defect of the run (``Finding.defect``: it fails the check even
    where the reference shares it), but for an in-flight table change over the same KV (a race on
    the table that reads the right values: every release rewrites a live cell to the tree's
    duplicate slot, ``docs/scheduler-driven.md``); an in-flight read of wrong KV is one whatever
    becomes of the token (sgl-project/sglang#18744). A defect the release is known to have is named
    (``kvparity.engine.real.defects``)."""
    found: dict[str, tuple[str, bool, str]] = {}
    for finding in run.inflight:
        found.setdefault(f"in flight, {finding.kind} ({finding.cls}, {finding.harm})",
                         (finding.line(), finding.harm == WRONG_KV, ""))
    for read in run.canary:
        found.setdefault("KV canary: a read of wrong KV at a launch",
                         (f"iteration {read.iteration}: {read.line()}", True, ""))
    for problem in traffic_problems(scenario, run):
        found.setdefault(f"memory oracle: {problem.oracle}", (problem.line(), True, ""))
    if run.error is not None:
        error = run.error
        where = f" (at {error.where})" if error.where else ""
        found.setdefault("the scheduler raised", (f"iteration {error.iteration}: {error.message}{where}", True,
                                                  error.traceback))
    out = []
    for kind, (line, defect, detail) in found.items():
        known = known_defect(player.release, scenario.config, kind, line) if defect else None
        out.append(Finding(_label(player.name, kind, known), player.name, line, defect, known, detail, kind))
    return tuple(out)


def _label(where: str, kind: str, known: KnownDefect | None) -> str:
    """What a finding is counted under: where and what, and the known defect it is, so that a group
    is known only when every scenario in it met that defect (an unknown one of the same kind, in the
    same player, is counted apart)."""
    return f"{where}: {kind}" + (f" ({known.name})" if known else "")


def _accounting(run: TrafficRun, iteration: int) -> str:
    """The accounting a run's admission reckoned with at ``iteration`` (its snapshot's)."""
    if iteration >= len(run.memory) or not run.memory[iteration].accounting:
        return "not recorded"
    return ", ".join(f"{name} {value:g}" for name, value in run.memory[iteration].accounting)


def check_scheduler(reference: TrafficPlayer, checked: TrafficPlayer, *, examples: int = DEFAULT_TRAFFIC_EXAMPLES,
                    policies: tuple[str, ...] = POLICIES, loops: tuple[str, ...] = LOOPS, seed: int | None = None,
                    shrink_budget_s: float | None = DEFAULT_BUDGET_S, shrink_tries: int | None = None,
                    events: Any = None) -> Verdict:
    """A scheduler-driven sweep of two players (the caller's, left open) in one call, in this process
    (tests and scripts use it). ``shrink_tries`` bounds each shrink by candidates played, which a
    busy machine cannot change (``SweepPlan``)."""
    from kvparity.run.plan import FINDING_BUDGET_S, SweepPlan
    from kvparity.run.sweep import sweep

    spec = SchedulerSpec(player_spec(reference), player_spec(checked), policies, loops)
    drive = SchedulerDrive(spec, players=(reference, checked))
    try:
        plan = SweepPlan(spec, tuple(drive.tasks(examples, seed)), shrink_budget_s, FINDING_BUDGET_S, shrink_tries)
        return sweep(drive, plan, events=events)
    finally:
        drive.close()

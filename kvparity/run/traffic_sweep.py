"""The scheduler-driven check (issue 26): traffic scenarios played by a reference and a checked
player (``kvparity.engine.traffic_players``), under every schedule policy and event loop both can
play, every run judged (``kvparity.judge.admission.judge_traffic``): decisions, outputs and the
in-flight oracle's findings.

Per policy and loop, ``examples`` scenarios are drawn (Hypothesis, derandomized unless a seed is
given) and all are played, so a difference is counted, not only found; the first is then shrunk
(``minimize`` with ``traffic_candidates``) and its cause diagnosed. The in-flight oracle's findings
are counted per player, and the first of each kind and class is shrunk too: a finding both players
have is a property of both (reported, not a divergence); one only the checked player has is a
divergence.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, seed, settings

from kvparity.engine.traffic_players import TrafficPlayer
from kvparity.engine.traffic_run import TrafficRun
from kvparity.judge.admission import DecisionDifference, TrafficJudgement, judge_traffic, traffic_problems
from kvparity.judge.traffic_classes import traffic_classes
from kvparity.mem_cache.schedule_policy import POLICIES
from kvparity.model.traffic import LOOPS, TrafficScenario
from kvparity.model.traffic_records import InflightFinding
from kvparity.model.traffic_strategies import traffic_scenarios
from kvparity.run.minimize import Shrunk, minimize
from kvparity.run.traffic_shrink import traffic_candidates

DEFAULT_TRAFFIC_EXAMPLES = 40  # per policy and loop
FINDING_BUDGET_S = 15.0  # shrinking the first example of an in-flight finding

# Admission changes whose cause is known, by (reference release, checked release): named in the
# verdict when the diagnosis agrees (the same traffic under fcfs decides alike).
KNOWN_ADMISSION_CAUSES = {
    ("0.5.3", "0.5.3.post1"): "pull request #11200 changed the key that ranks the waiting queue "
                              "(SchedulePolicy._compute_prefix_matches: Req.adjust_max_prefix_ids(), capped at "
                              "len-1 and at the logprob start, became origin_input_ids + output_ids)",
}


@dataclass
class FirstDifference:
    scenario: TrafficScenario  # as drawn
    judgement: TrafficJudgement
    shrunk: Shrunk | None = None  # its scenario is a TrafficScenario
    shrunk_judgement: TrafficJudgement | None = None
    cause: str | None = None

    @property
    def shown(self) -> tuple[TrafficScenario, TrafficJudgement]:
        """What a report shows: the shrunk scenario and its judgement, else the scenario as drawn."""
        if self.shrunk is not None and self.shrunk_judgement is not None:
            return self.shrunk.scenario, self.shrunk_judgement
        return self.scenario, self.judgement


@dataclass
class InflightExample:
    finding: InflightFinding
    scenario: TrafficScenario
    shrunk: Shrunk | None = None
    shrunk_finding: InflightFinding | None = None

    @property
    def shown(self) -> tuple[InflightFinding, TrafficScenario]:
        """The finding and scenario a report shows: shrunk when shrinking ran, else as first seen."""
        if self.shrunk is not None and self.shrunk_finding is not None:
            return self.shrunk_finding, self.shrunk.scenario
        return self.finding, self.scenario


@dataclass
class InflightTotals:
    """One player's in-flight findings over a verdict's overlap-loop rows."""

    counts: Counter[tuple[str, str, str]]  # by (kind, class, harm)
    scenarios_with: int  # scenarios with any finding
    scenarios: int  # scenarios played in the overlap loop
    first: dict[tuple[str, str, str], InflightExample]  # the first example of each (kind, class, harm)


@dataclass
class TrafficRow:
    """One policy under one event loop."""

    policy: str
    loop: str
    scenarios: int = 0
    differing: int = 0  # decisions, outputs or in-flight findings differ
    admission: int = 0  # of which the admitted requests (or their order) differ
    first: FirstDifference | None = None
    classes: Counter[str] = field(default_factory=Counter)  # traffic classes, by scenarios reaching them
    # Per player name: in-flight findings by (kind, class, harm), scenarios with any, the first of each shrunk.
    inflight: dict[str, Counter[tuple[str, str, str]]] = field(default_factory=dict)
    inflight_scenarios: Counter[str] = field(default_factory=Counter)
    inflight_examples: dict[str, dict[tuple[str, str, str], InflightExample]] = field(default_factory=dict)
    # Per player name: what its runs found that both players may share (properties of a release, not
    # differences): reads of wrong KV at a launch, memory oracles failed; scenarios reaching each,
    # with the first (scenario, line).
    findings: dict[str, Counter[str]] = field(default_factory=dict)
    finding_examples: dict[str, dict[str, tuple[TrafficScenario, str]]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return "parity" if self.differing == 0 else "divergence"


@dataclass
class TrafficVerdict:
    reference: str
    checked: str
    rows: list[TrafficRow]
    seconds: float

    @property
    def verdict(self) -> str:
        return "parity" if all(r.verdict == "parity" for r in self.rows) else "divergence"

    @property
    def classes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for row in self.rows:
            total.update(row.classes)
        return total

    @property
    def scenarios(self) -> int:
        return sum(r.scenarios for r in self.rows)

    def inflight(self, name: str) -> InflightTotals:
        """Player ``name``'s in-flight findings, summed over the overlap-loop rows."""
        overlap = [r for r in self.rows if r.loop == "overlap"]
        totals = InflightTotals(Counter(), sum(r.inflight_scenarios[name] for r in overlap),
                                sum(r.scenarios for r in overlap), {})
        for row in overlap:
            totals.counts.update(row.inflight.get(name, {}))
            for key, example in row.inflight_examples.get(name, {}).items():
                totals.first.setdefault(key, example)
        return totals

    def findings(self) -> dict[str, tuple[Counter[str], dict[str, tuple[TrafficScenario, str]]]]:
        """Per player: its runs' own findings (scenarios reaching each) and the first example of each."""
        out: dict[str, tuple[Counter[str], dict[str, tuple[TrafficScenario, str]]]] = {}
        for row in self.rows:
            for name, counts in row.findings.items():
                total, first = out.setdefault(name, (Counter(), {}))
                total.update(counts)
                for label, example in row.finding_examples[name].items():
                    first.setdefault(label, example)
        return out

    def summary(self) -> str:
        """One line: what differs (by the kind of each differing row's first difference) under which
        policies and loops, and the policies under which nothing does."""
        policies = list(dict.fromkeys(r.policy for r in self.rows))
        if self.verdict == "parity":
            return "PARITY under " + ", ".join(policies)
        groups: dict[str, list[TrafficRow]] = {}
        for row in self.rows:
            if row.first is not None:
                groups.setdefault(_KIND_WORDS[_row_kind(row)], []).append(row)
        parts = []
        for what, rows in groups.items():
            loops = list(dict.fromkeys(r.loop for r in rows))
            where = "" if set(loops) == {r.loop for r in self.rows} else f" ({', '.join(loops)} loop)"
            parts.append(f"{what} under {', '.join(dict.fromkeys(r.policy for r in rows))}{where}")
        same = [p for p in policies if all(r.verdict == "parity" for r in self.rows if r.policy == p)]
        return "DIVERGENCE: " + "; ".join(parts + (["parity under " + ", ".join(same)] if same else []))


_KIND_WORDS = {"admission": "admission differs", "decision": "decisions differ",
               "inflight": "in-flight findings the reference lacks", "error": "the scheduler stopped on an error",
               "outputs": "outputs differ", "memory": "memory differs under the same decisions",
               "oracle": "memory oracles fail", "canary": "reads of wrong KV (canary)"}


def _row_kind(row: TrafficRow) -> str:
    judgement = row.first.judgement if row.first is not None else None
    if judgement is None:
        return "decision"
    return "admission" if judgement.kind == "decision" and judgement.admission else judgement.kind


def finding_label(key: tuple[str, str, str]) -> str:
    """An in-flight finding's (kind, class, harm) in words: "cell (live, table only)"."""
    kind, cls, harm = key
    return f"{kind} ({cls}, {harm})"


def drawn(count: int, policy: str, loop: str, seed_value: int | None = None) -> list[TrafficScenario]:
    """``count`` traffic scenarios under ``policy`` and ``loop`` (derandomized unless ``seed_value``)."""
    found: list[TrafficScenario] = []

    @settings(max_examples=count, derandomize=seed_value is None, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(traffic_scenarios(policies=(policy,)))
    def keep(scenario: TrafficScenario) -> None:
        found.append(dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, loop=loop)))

    if seed_value is not None:
        keep = seed(seed_value)(keep)
    keep()
    return found


def check_traffic(reference: TrafficPlayer, checked: TrafficPlayer, *, examples: int = DEFAULT_TRAFFIC_EXAMPLES,
                  policies: tuple[str, ...] = POLICIES, loops: tuple[str, ...] = LOOPS, seed_value: int | None = None,
                  shrink_budget_s: float | None = 45.0, finding_budget_s: float = FINDING_BUDGET_S,
                  progress: Callable[[TrafficRow], None] | None = None) -> TrafficVerdict:
    """Every policy under every loop both players can play; ``shrink_budget_s`` None: no shrinking;
    ``finding_budget_s``: for the first example of each in-flight finding, per player."""
    start = time.monotonic()
    loops = tuple(loop for loop in loops if loop in reference.loops and loop in checked.loops)
    rows = []
    shrunk_findings: set[tuple[str, ...]] = set()  # (player, kind, class, harm): the first is shrunk once per run
    with ThreadPoolExecutor(2) as pool:  # the two players at once: real ones are separate processes
        def both(scenario: TrafficScenario) -> Played:
            ref = pool.submit(reference.play, scenario)
            runs = ref.result(), checked.play(scenario)
            return runs, judge_traffic(scenario, *runs, reference.world_id, checked.world_id)

        for loop in loops:
            for policy in policies:
                row = _sweep_row(both, reference, checked, drawn(examples, policy, loop, seed_value), policy, loop,
                                 shrink_budget_s, finding_budget_s, shrunk_findings)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return TrafficVerdict(reference.name, checked.name, rows, time.monotonic() - start)


Played = tuple[tuple[TrafficRun, TrafficRun], TrafficJudgement]  # both runs, judged
Both = Callable[[TrafficScenario], Played]


def _sweep_row(both: Both, reference: TrafficPlayer, checked: TrafficPlayer, scenarios: list[TrafficScenario],
               policy: str, loop: str, shrink_budget_s: float | None, finding_budget_s: float,
               shrunk_findings: set[tuple[str, ...]]) -> TrafficRow:
    t0 = time.monotonic()
    row = TrafficRow(policy, loop)
    players = (reference, checked)
    for player in players:
        row.inflight[player.name] = Counter()
        row.inflight_examples[player.name] = {}
        row.findings[player.name] = Counter()
        row.finding_examples[player.name] = {}
    for scenario in scenarios:
        results, judgement = both(scenario)
        row.scenarios += 1
        row.classes.update(traffic_classes(scenario, results[0]))
        for player, result in zip(players, results):
            _count_inflight(row, player.name, scenario, result)
            _count_findings(row, player.name, scenario, result)
        if not judgement.agree:
            row.differing += 1
            row.admission += judgement.admission
            if row.first is None:
                row.first = FirstDifference(scenario, judgement)
    if shrink_budget_s is not None:
        if row.first is not None:
            _shrink_difference(row.first, both, reference, checked, shrink_budget_s)
        for player in players:
            for key, example in row.inflight_examples[player.name].items():
                if (player.name, *key) not in shrunk_findings:
                    shrunk_findings.add((player.name, *key))
                    _shrink_finding(example, player, key, min(shrink_budget_s, finding_budget_s))
    row.seconds = time.monotonic() - t0
    return row


def _count_inflight(row: TrafficRow, name: str, scenario: TrafficScenario, result: TrafficRun) -> None:
    findings = result.inflight
    if findings:
        row.inflight_scenarios[name] += 1
    for finding in findings:
        row.inflight[name][finding.key] += 1
        row.inflight_examples[name].setdefault(finding.key, InflightExample(finding, scenario))


def _count_findings(row: TrafficRow, name: str, scenario: TrafficScenario, result: TrafficRun) -> None:
    """A run's reads of wrong KV and failed memory oracles, per kind, once per scenario."""
    seen: dict[str, str] = {}
    for read in result.canary:
        seen.setdefault("KV canary: a read of wrong KV at a launch", f"iteration {read.iteration}: {read.line()}")
    for problem in traffic_problems(scenario, result):
        seen.setdefault(f"memory oracle: {problem.oracle}", problem.line())
    for label, line in seen.items():
        row.findings[name][label] += 1
        row.finding_examples[name].setdefault(label, (scenario, line))


def _same_difference(judgement: TrafficJudgement, first: TrafficJudgement) -> bool:
    """A candidate keeps the failure when its first symptom is of the same kind: an admission
    difference for an admission difference, the same decision field, an in-flight finding, an error."""
    if judgement.agree or judgement.kind != first.kind:
        return False
    if first.kind == "decision" and first.decision is not None and judgement.decision is not None:
        return judgement.admission if first.admission else judgement.decision.field == first.decision.field
    return True


def _shrink_difference(first: FirstDifference, both: Both, reference: TrafficPlayer, checked: TrafficPlayer,
                       budget_s: float) -> None:
    first.shrunk = minimize(first.scenario, lambda s: _same_difference(both(s)[1], first.judgement),
                            budget_s=budget_s, candidates=traffic_candidates)
    first.shrunk_judgement = both(first.shrunk.scenario)[1]
    first.cause = diagnose(first.shrunk.scenario, first.shrunk_judgement, both, reference, checked)


def diagnose(scenario: TrafficScenario, judgement: TrafficJudgement, both: Both, reference: TrafficPlayer,
             checked: TrafficPlayer) -> str | None:
    """The cause of an admission difference, when it can be shown: the same traffic under fcfs (no
    ranking) decides alike, so the policy's ranking of the waiting queue differs; and, for a pair
    whose ranking change is known, which change."""
    decision: DecisionDifference | None = judgement.decision
    if decision is None or not decision.admission or scenario.config.schedule_policy == "fcfs":
        return None
    fcfs = dataclasses.replace(scenario, config=dataclasses.replace(scenario.config, schedule_policy="fcfs"))
    if not both(fcfs)[1].agree:
        return None
    cause = (f"the waiting queue's ranking under {scenario.config.schedule_policy} differs (the same traffic under "
             "fcfs decides alike)")
    known = KNOWN_ADMISSION_CAUSES.get((reference.release, checked.release))
    return cause + (f": {known}" if known else "")


def _shrink_finding(example: InflightExample, player: TrafficPlayer, key: tuple[str, str, str], budget_s: float) -> None:
    def reaches(scenario: TrafficScenario) -> bool:
        return any(f.key == key for f in player.play(scenario).inflight)

    example.shrunk = minimize(example.scenario, reaches, budget_s=budget_s, candidates=traffic_candidates)
    example.shrunk_finding = next(f for f in player.play(example.shrunk.scenario).inflight if f.key == key)

"""kvparity explain's parts on hand-made inputs: delta debugging with three outcomes, the changed
units of two modules, a hybrid module spliced from them, and a hybrid folder that leaves A intact."""

import pytest

from kvparity.run.ddmin import FAIL, PASS, UNRESOLVED, ddmin
from kvparity.run.hybrid import (
    MODULE_REST,
    FileChange,
    FunctionChange,
    build_hybrid,
    changed_files,
    function_changes,
    hybrid_text,
)


def test_ddmin_finds_the_two_changes_that_fail_only_together():
    tested = []

    def test(subset):
        tested.append(subset)
        return FAIL if {3, 7} <= set(subset) else PASS

    assert ddmin(range(10), test) == (3, 7)
    assert len(tested) == len(set(tested))  # each subset tested once


def test_ddmin_leaves_out_what_cannot_be_told():
    # 5 alone does not import (unresolved); with 4 beside it, it fails: the answer needs both.
    def test(subset):
        if 5 in subset and 4 not in subset:
            return UNRESOLVED
        return FAIL if 5 in subset else PASS

    assert ddmin(range(10), test) == (4, 5)


A = '''import os

LIMIT = 1


def same():
    return 1


def changed():
    return 1


class Pool:
    size = 4

    def alloc(self):
        return 1

    def free(self):
        return 1
'''
B = '''import os

LIMIT = 2


def same():
    return 1


def changed():
    return 2


def added():
    return 3


class Pool:
    size = 4

    def alloc(self):
        return 2

    def free(self):
        return 1
'''


def test_the_changed_units_of_a_module_are_its_functions_methods_and_the_rest():
    assert function_changes("m.py", A, B) == [
        FunctionChange("m.py", MODULE_REST, "changed"),  # LIMIT
        FunctionChange("m.py", "Pool.alloc", "changed"),
        FunctionChange("m.py", "added", "added"),
        FunctionChange("m.py", "changed", "changed"),
    ]


def test_a_hybrid_module_takes_only_the_chosen_functions_from_b():
    hybrid = hybrid_text(A, B, {"Pool.alloc"})
    assert "LIMIT = 1" in hybrid and "def added" not in hybrid
    assert hybrid.count("return 2") == 1 and "def changed():\n    return 1" in hybrid
    assert hybrid_text(A, B, set()) == A
    assert hybrid_text(A, B, {MODULE_REST, "Pool.alloc", "added", "changed"}) == B
    # B's module with one function kept as A has it; an added one lands at the module's end.
    assert "def changed():\n    return 1" in hybrid_text(A, B, {MODULE_REST, "Pool.alloc", "added"})
    assert hybrid_text(A, B, {"added"}).rstrip().endswith("return 3")


def test_a_hybrid_folder_replaces_its_files_and_leaves_a_untouched(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, text in ((a, A), (b, B)):
        (root / "sglang" / "srt").mkdir(parents=True)
        (root / "sglang" / "srt" / "m.py").write_text(text)
        (root / "sglang" / "version.py").write_text(f"__version__ = {str(root.name)!r}\n")
    (b / "sglang" / "srt" / "new.py").write_text("X = 1\n")
    assert changed_files(a, b) == [FileChange("sglang/srt/m.py", "changed"), FileChange("sglang/srt/new.py", "added")]
    hybrid = build_hybrid(a, {"sglang/srt/m.py": B}, tmp_path / "h")
    assert (hybrid / "sglang" / "srt" / "m.py").read_text() == B
    assert (a / "sglang" / "srt" / "m.py").read_text() == A  # a hard link is unlinked, not written through
    assert (hybrid / "sglang" / "version.py").read_text() == "__version__ = 'a'\n"


def test_a_hybrid_takes_a_module_beside_a_file_only_when_it_imports_a_name_only_b_defines(tmp_path):
    from kvparity.run.hybrid import defined_names, imported_names

    a, b = tmp_path / "a", tmp_path / "b"
    for root, helper in ((a, "def old():\n    pass\n"), (b, "def old():\n    pass\n\n\ndef new():\n    pass\n")):
        (root / "sglang" / "srt").mkdir(parents=True)
        (root / "sglang" / "srt" / "helper.py").write_text(helper)
    (b / "sglang" / "srt" / "user.py").write_text("from .helper import new, old\nfrom sglang.srt import helper\n")
    (b / "sglang" / "srt" / "__init__.py").write_text("")
    assert imported_names(b, "sglang/srt/user.py") == {
        ("sglang/srt/helper", "new"), ("sglang/srt/helper", "old"), ("sglang/srt", "helper")}
    assert defined_names(a, "sglang/srt/helper") == {"old"}
    assert defined_names(b, "sglang/srt") == {"helper", "user"}  # a package's names: its modules


def test_a_hybrid_takes_the_files_its_changes_need_to_import_and_no_other(tmp_path):
    """B's ``user.py`` imports ``new``, which only B's ``helper.py`` defines: the helper comes too;
    B's helper no longer defines ``old``, which A's ``caller.py`` imports: B's caller comes too
    (transitively). A module of a package brings the package's ``__init__``. Nothing else comes."""
    from kvparity.run.explain import Explanation, _Search

    a_files = {"srt/helper.py": "def old():\n    pass\n", "srt/user.py": "X = 1\n",
               "srt/caller.py": "from .helper import old\n", "srt/pkg/__init__.py": "",
               "srt/pkg/mod.py": "Y = 1\n", "srt/alone.py": "Z = 1\n"}
    b_files = {"srt/helper.py": "def new():\n    pass\n", "srt/user.py": "from .helper import new\n",
               "srt/caller.py": "Q = 2\n", "srt/pkg/__init__.py": "P = 2\n", "srt/pkg/mod.py": "Y = 2\n",
               "srt/alone.py": "Z = 2\n"}
    for root, files in ((tmp_path / "a", a_files), (tmp_path / "b", b_files)):
        for path, text in files.items():
            (root / "sglang" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "sglang" / path).write_text(text)
    search = _Search(str(tmp_path / "a"), str(tmp_path / "b"), None, None, Explanation("a", "b"), print)
    search.candidates = tuple(changed_files(tmp_path / "a", tmp_path / "b"))

    def needed(*paths: str) -> list[str]:
        chosen = tuple(c for c in search.candidates if c.path.removeprefix("sglang/") in paths)
        return [c.path.removeprefix("sglang/") for c in search.needed(chosen)]

    assert needed("srt/user.py") == ["srt/caller.py", "srt/helper.py", "srt/user.py"]
    assert needed("srt/pkg/mod.py") == ["srt/pkg/__init__.py", "srt/pkg/mod.py"]
    assert needed("srt/alone.py") == ["srt/alone.py"]


def test_only_changed_functions_a_run_called_are_searched_and_module_code_always_is():
    """A method counts as run when it, or a function nested in it, was called; a class only one side
    has, when one of its methods was; module-level code and whole files always count."""
    from kvparity.run.explain import _ran

    called = {("m.py", "Batch.prepare"), ("m.py", "helper.<locals>.inner"), ("m.py", "New.__init__")}
    unit = lambda name: FunctionChange("m.py", name, "changed")  # noqa: E731
    assert _ran(unit("Batch.prepare"), called) and _ran(unit("helper"), called) and _ran(unit("New"), called)
    assert not _ran(unit("Batch.prepare_decode"), called)  # a longer name that starts the same
    assert not _ran(unit("Batch.prep"), called)  # a shorter one: not its method
    assert not _ran(FunctionChange("other.py", "Batch.prepare", "changed"), called)
    assert _ran(unit(MODULE_REST), called) and _ran(FileChange("x.txt", "changed"), set())


def test_a_changed_binary_file_is_one_line_of_the_culprit_diff(tmp_path):
    """A compiled extension in the culprit (0.5.22's Rust tree core) is named, not diffed as text:
    read as text it made a 23 MB diff."""
    from kvparity.run.explain import _diff

    for side, body in (("a", b"\x7fELF\0\1"), ("b", b"\x7fELF\0\2")):
        (tmp_path / side).mkdir()
        (tmp_path / side / "core.so").write_bytes(body)
        (tmp_path / side / "m.py").write_text(f"x = '{side}'\n")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert _diff(a, b, "core.so", [FileChange("core.so", "changed")]) == "Binary files a/core.so and b/core.so differ\n"
    assert "-x = 'a'\n+x = 'b'\n" in _diff(a, b, "m.py", [FileChange("m.py", "changed")])


def test_a_hybrid_that_breaks_where_b_did_not_is_unresolved_not_a_verdict():
    """A hybrid whose SGLang raises differs from A, but not as B does: it is neither FAIL (0.5.6's
    one new MatchResult field, spliced alone into 0.5.5.post3, broke a tuple unpacking, and that
    once stood as the culprit) nor PASS."""
    from types import SimpleNamespace

    from kvparity.run.explain import Explanation, _Search

    class Replayer:
        def same(self, played, first):
            return played.line == first.line

        def broken(self, played):
            return played.line if played.line.startswith("raised") else None

    def judged(line, first_line="r2 cached_tokens 0 against 12"):
        first = SimpleNamespace(line=first_line)
        return _Search("a", "b", Replayer(), first, Explanation("a", "b"), print)._judged(SimpleNamespace(line=line))[0]

    assert judged("r2 cached_tokens 0 against 12") == FAIL
    assert judged("raised ValueError: too many values to unpack") == UNRESOLVED
    assert judged("r5 prefix_len 3 against 4") == PASS
    assert judged("raised KeyError", first_line="raised ValueError") == PASS  # B broke too: a verdict


def test_a_scheduler_that_raised_is_broken_even_where_a_decision_difference_shows_first():
    """A hybrid whose scheduler differs first as B does, then raises (0.5.9's first answer: B's
    memory difference at iteration 0, SGLang's row-leak check raised at iteration 1), is broken all
    the same: a hybrid broken where B was not is unresolved even when its first difference is B's."""
    from types import SimpleNamespace

    from kvparity.cli.explain import _Replaying
    from kvparity.model.traffic_records import StopError
    from kvparity.run.explain import Explanation, _Search
    from kvparity.run.scheduler_drive import SchedulerDrive

    def played(error):
        run = SimpleNamespace(error=error)
        return SimpleNamespace(kind="decision", line="iteration 37: mode 'EXTEND' != 'DECODE'",
                               result=((SimpleNamespace(error=None), run), None))

    drive = SchedulerDrive.__new__(SchedulerDrive)  # its checker part judges the hybrid's play
    drive.same = lambda p, first: p.line == first.line
    replayer = _Replaying(None, lambda source: (drive, lambda: None))
    replayer.drive = drive
    stopped = played(StopError(37, "TypeError: cannot unpack non-iterable PoolStats object",
                               "sglang/srt/managers/scheduler.py:12 in on_idle"))
    assert replayer.broken(played(None)) is None
    assert replayer.broken(stopped) == ("iteration 37: the scheduler raised TypeError: cannot unpack non-iterable "
                                        "PoolStats object (at sglang/srt/managers/scheduler.py:12 in on_idle)")
    search = _Search("a", "b", replayer, played(None), Explanation("a", "b"), print)
    assert search._judged(stopped)[0] == UNRESOLVED and search._judged(played(None))[0] == FAIL


def test_explain_names_the_line_of_a_planted_one_line_mutant(tmp_path):
    """A copy of 0.5.3.post1 with one line changed, explained against the release on a scenario
    it differs on: the culprit is that line's function, and its diff is that line."""
    from kvparity.cli.explain import _explain_one
    from kvparity.engine.real.install import resolve
    from kvparity.model.traffic import Arrival, ServerConfig, TrafficScenario
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    mutant = REAL_MUTANTS_BY_NAME["decode-writes-one-column-back"]
    copy = make_mutated_copy(resolve(mutant.version), mutant, tmp_path / "copy")
    scenario = TrafficScenario(ServerConfig(kv_slots=128, max_prefill_tokens=256), ((Arrival("r5", (100000,), 32),),))
    found = _explain_one(mutant.against, str(copy), scenario, "scheduler", "torch", None)
    assert found.status == "culprit", found.lines()
    assert [(c.path, c.name) for c in found.functions] == [(mutant.path, "ScheduleBatch.prepare_for_decode")]
    removed = [line for line in found.diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in found.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert (removed, added) == (["-" + mutant.old.rstrip("\n")], ["+" + mutant.new.rstrip("\n")])


def test_every_differing_pair_of_the_committed_matrices_can_be_explained():
    """``kvparity explain --matrix`` replays each differing pair from the scenario its matrix saved:
    the committed matrices hold one for every pair that diverges (13 scheduler-driven, 5 harness-driven)."""
    import json
    from pathlib import Path

    from kvparity.cli.check import scenario_and_drive
    from kvparity.cli.explain import differing_pairs

    root = Path(__file__).resolve().parents[2] / "docs" / "matrix"
    for name, drive, count in (("scheduler-0.5.3-0.5.23.json", "scheduler", 13), ("matrix-0.5.3-0.5.23.json", "harness", 5)):
        pairs = differing_pairs(json.loads((root / name).read_text()))
        assert len(pairs) == count, name
        assert {scenario_and_drive(p["scenario"])[1] for p in pairs} == {drive}
    # Each culprit names the releases as the user did, never this machine's cache folders.
    for name in ("culprits-scheduler.json", "culprits-harness.json"):
        for e in json.loads((root / name).read_text())["explained"]:
            x = e["explanation"]
            assert (x.get("reference", e["reference_release"]), x.get("checked", e["other_release"])) == (
                e["reference_release"], e["other_release"]), name


@pytest.mark.parametrize("argv, message", [
    (["explain", "--sglang", "0.5.3.post1"], "give --sglang B --against A --replay FILE"),
    (["explain", "--matrix", "m.json", "--sglang", "0.5.3"], "give it alone"),
    (["explain", "--sglang", "0.5.3.post1", "--against", "0.5.3", "--replay", "x.json", "--markdown", "x.md"],
     "--markdown is for --matrix"),
])
def test_explain_usage_errors_exit_2_and_say_why(argv, message, capsys):
    from kvparity.cli.main import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_hybrid_as_adapter_cannot_drive_is_driven_by_bs(monkeypatch):
    """A hybrid keeps A's version file, so A's adapter drives it first; where that adapter cannot
    (0.5.3.post2's global_config.py no longer has what 0.5.3.post1's adapter reads), B's does."""
    from kvparity.cli.explain import _Replaying
    from kvparity.engine.errors import RealSGLangError
    from kvparity.engine.real.install import SGLangSource

    monkeypatch.setattr("kvparity.engine.real.install.resolve",
                        lambda folder: SGLangSource(folder, "0.5.3.post1", "path", "0.5.3.post1"))
    driven = []

    class Drive:  # a drive of A against one source: its player raises where A's adapter cannot drive it
        def __init__(self, source):
            self.source = source

        def play(self, scenario):
            driven.append(self.source.entry.version)
            if self.source.entry.version == "0.5.3.post1":
                raise RealSGLangError("'GlobalConfig' object has no attribute 'default_init_new_token_ratio'")
            return "played"

        def broken(self, played):
            return None

        def close(self):
            pass

    replayer = _Replaying("scenario", lambda source: (Drive(source), lambda: None))
    replayer.b_entry = "0.5.3.post2"
    assert replayer.play("hybrid") == "played" and driven == ["0.5.3.post1", "0.5.3.post2"]


def test_a_matrix_run_keeps_pairs_explained_anywhere_and_explains_only_the_others(tmp_path, monkeypatch):
    """Two runs may share a matrix's pairs out (each pair costs minutes to an hour): their
    explanations put together in one ``--json`` are kept wherever they stand, the rest explained,
    all written in the matrix's order."""
    import argparse
    import json

    from kvparity.cli import explain

    def pair(a, b):
        return {"reference_release": a, "other_release": b, "drive": "scheduler", "label": "divergent",
                "first_difference": {"line": "x", "scenario": {"form": "traffic"}}}

    matrix = tmp_path / "m.json"
    matrix.write_text(json.dumps({"pairs": [pair("1", "2"), pair("2", "3"), pair("3", "4")]}))
    done = {"reference_release": "2", "other_release": "3", "drive": "scheduler",
            "explanation": {"status": "unexplained", "why": "kept"}}
    out = tmp_path / "culprits.json"
    out.write_text(json.dumps({"matrix": "m.json", "explained": [done], "pending": []}))
    explained_now = []
    monkeypatch.setattr("kvparity.cli.check.scenario_and_drive", lambda s: (s, "scheduler"))
    monkeypatch.setattr(explain, "_explain_one", lambda a, b, *_: explained_now.append((a, b)) or "none here")

    explain._explain_matrix(argparse.Namespace(matrix=str(matrix), json=str(out), markdown=None, fresh=False))
    written = json.loads(out.read_text())
    assert explained_now == [("1", "2"), ("3", "4")]
    assert [(e["reference_release"], e["explanation"]["why"]) for e in written["explained"]] == \
        [("1", "none here"), ("2", "kept"), ("3", "none here")]
    assert written["pending"] == []


def test_every_hybrid_has_the_files_b_added_that_are_not_python(tmp_path):
    """B's code taken into a hybrid may read data files B added beside it (0.5.17's JIT kernels
    refuse to start without their csrc/ folder); A's code never reads them, so every hybrid has them."""
    import json
    import os
    from pathlib import Path

    from kvparity.engine.real.worker import LOADED_ENV
    from kvparity.judge.verdict import Played
    from kvparity.run.explain import CULPRIT, explain

    for name, text in (("a", A), ("b", B)):
        (tmp_path / name / "sglang").mkdir(parents=True)
        (tmp_path / name / "sglang" / "m.py").write_text(text)
    (tmp_path / "b" / "sglang" / "csrc").mkdir()
    (tmp_path / "b" / "sglang" / "csrc" / "kernel.cu").write_text("// B's kernel source")

    class Replayer:
        def play(self, folder):
            if os.environ.get(LOADED_ENV):  # the baseline: B loaded m.py and called changed()
                (Path(os.environ[LOADED_ENV]) / "w.json").write_text(
                    json.dumps({"files": ["sglang/m.py"], "functions": [["sglang/m.py", "changed"]]}))
            if not (Path(folder) / "sglang" / "csrc" / "kernel.cu").exists():
                return Played(None, False, "raised", "raised RuntimeError: cannot find the csrc folder")
            differs = "return 2" in (Path(folder) / "sglang" / "m.py").read_text().split("def changed")[1]
            return Played(None, not differs, "x" if differs else None, "changed() 2 against 1" if differs else "")

        def same(self, played, first):
            return played.line == first.line

        def broken(self, played):
            return played.line if played.line.startswith("raised") else None

    found = explain(str(tmp_path / "a"), str(tmp_path / "b"), Replayer())
    assert found.status == CULPRIT and [f.name for f in found.functions] == ["changed"], found.lines()


# A's adder for the companion tests: ``add(1)`` leaves 9 of a budget of 10.
ADDER = ("class Adder:\n    def log(self, n):\n        return n\n\n"
         "    def start(self):\n        self.budget = 10\n\n"
         "    def add(self, n):\n        self.start()\n        self.log(n)\n        return self.budget - n\n")


def _explain_adder(tmp_path, b, outcomes=None, played=None):
    """``explain`` of ``ADDER`` -> ``b`` (one module), replayed by running ``add(1)``: a difference is
    the budget left, an error the hybrid's. Both runs called ``Adder.log`` and ``Adder.start``.
    ``played`` (a list) gets every folder replayed."""
    import json
    import os
    from pathlib import Path

    from kvparity.engine.real.worker import LOADED_ENV
    from kvparity.judge.verdict import Played
    from kvparity.run.explain import explain

    for name, text in (("a", ADDER), ("b", b)):
        (tmp_path / name / "sglang").mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "sglang" / "m.py").write_text(text)

    class Replayer:
        def play(self, folder):
            (played if played is not None else []).append(folder)
            if os.environ.get(LOADED_ENV):
                (Path(os.environ[LOADED_ENV]) / "w.json").write_text(json.dumps(
                    {"files": ["sglang/m.py"], "functions": [["sglang/m.py", f"Adder.{n}"] for n in ("log", "start")]}))
            space: dict = {}
            exec((Path(folder) / "sglang" / "m.py").read_text(), space)
            try:
                left = space["Adder"]().add(1)
            except (AttributeError, TypeError, NameError) as exc:
                return Played(None, False, "raised", f"raised {type(exc).__name__}: {exc}")
            return Played(None, left == 9, None if left == 9 else "x", "" if left == 9 else f"budget left {left}")

        def same(self, played, first):
            return played.line == first.line

        def broken(self, played):
            return played.line if played.line.startswith("raised") else None

    return explain(str(tmp_path / "a"), str(tmp_path / "b"), Replayer(), outcomes=outcomes)


def test_a_search_run_again_reads_back_the_hybrids_it_played_and_gives_the_same_answer(tmp_path):
    """A search stopped part way resumes: run again with the same kept outcomes, it replays only A
    against B (to learn what ran) and reads every hybrid back; with nothing kept it plays them all."""
    from kvparity.run.hybrid_outcomes import HybridOutcomes

    b = ADDER.replace("        self.budget = 10\n", "        self.budget = 5\n")
    kept = tmp_path / "outcomes.jsonl"
    first_plays: list = []
    first = _explain_adder(tmp_path, b, HybridOutcomes(kept), first_plays)
    again_plays: list = []
    again = _explain_adder(tmp_path, b, HybridOutcomes(kept), again_plays)
    assert [f.name for f in again.functions] == [f.name for f in first.functions] == ["Adder.start"]
    assert (len(first_plays), first.reused) == (first.hybrids + 1, 0)
    assert (len(again_plays), again.reused, again.hybrids) == (1, first.hybrids, first.hybrids)
    unkept_plays: list = []
    _explain_adder(tmp_path, b, HybridOutcomes(None), unkept_plays)
    assert len(unkept_plays) == first.hybrids + 1


def test_a_hybrid_is_named_by_the_files_it_takes_from_b_not_by_their_order():
    from kvparity.run.hybrid_outcomes import hybrid_name

    one = hybrid_name({"sglang/a.py": "x = 1\n", "sglang/b.py": None, "sglang/k.so": b"\0"})
    assert one == hybrid_name({"sglang/k.so": b"\0", "sglang/b.py": None, "sglang/a.py": "x = 1\n"})
    assert one != hybrid_name({"sglang/a.py": "x = 2\n", "sglang/b.py": None, "sglang/k.so": b"\0"})
    assert one != hybrid_name({"sglang/a.py": "x = 1\n", "sglang/b.py": "", "sglang/k.so": b"\0"})


@pytest.mark.parametrize(("b_start", "culprit"), [
    ("        self.budget = 5\n        self.logged = 0\n", ["Adder.start"]),
    ("        self.budget = 5\n        self.logged = 0\n        self.log(0, 1)\n", ["Adder.log", "Adder.start"]),
], ids=["the companion alone carries it", "the companion cannot run without it"])
def test_a_culprit_the_hybrids_took_as_a_companion_is_named_not_the_change_that_needed_it(tmp_path, b_start,
                                                                                          culprit):
    """B's ``log`` counts into a field only B's ``start`` sets, and ``start`` also halves the budget
    (the difference). The hybrid of ``log`` alone misses the field and learns ``start`` as a
    companion. Where ``start`` alone carries the difference it is the culprit, not ``log``; where it
    also calls ``log`` as only B's can be called, neither runs without the other: both are named."""
    from kvparity.run.explain import CULPRIT

    b = ADDER.replace("    def log(self, n):\n        return n\n",
                      "    def log(self, n, stamp=0):\n        self.logged += n\n        return n\n").replace(
        "        self.budget = 10\n", b_start)
    found = _explain_adder(tmp_path, b)
    assert found.status == CULPRIT and [f.name for f in found.functions] == culprit, found.lines()


def test_a_hybrid_whose_call_misses_an_argument_learns_b_s_callers_of_that_function(tmp_path):
    """B's ``limit`` needs a ``cap``; a hybrid with B's ``limit`` and A's ``budget`` fails with
    ``limit() missing 1 required positional argument: 'cap'``: B's callers of ``limit`` (``budget``,
    not the unrelated ``other``) are what it lacks, and are taken from then on."""
    from pathlib import Path

    from kvparity.judge.verdict import Played
    from kvparity.run.explain import Explanation, _Search

    a = "def limit(n):\n    return n\n\n\ndef budget(n):\n    return limit(n) + 1\n\n\ndef other():\n    return 0\n"
    b = ("def limit(n, cap):\n    return min(n, cap)\n\n\ndef budget(n):\n    return limit(n, 2) + 1\n\n\n"
         "def other():\n    return 1\n")
    for name, text in (("a", a), ("b", b)):
        (tmp_path / name / "sglang").mkdir(parents=True)
        (tmp_path / name / "sglang" / "m.py").write_text(text)

    class Replayer:
        def play(self, folder):
            space: dict = {}
            exec((Path(folder) / "sglang" / "m.py").read_text(), space)
            try:
                return Played(None, False, "x", f"budget {space['budget'](5)}")
            except TypeError as exc:
                return Played(None, False, "raised", f"raised TypeError: {exc}")

        def same(self, played, first):
            return played.line == first.line

        def broken(self, played):
            return played.line if played.line.startswith("raised") else None

    first = Played(None, False, "x", "budget 3")
    search = _Search(str(tmp_path / "a"), str(tmp_path / "b"), Replayer(), first, Explanation("a", "b"), print)
    units = {u.name: u for u in function_changes("sglang/m.py", a, b)}
    search.all_units = tuple(units.values())
    assert search.functions((units["limit"],)) == FAIL
    assert search.unit_companions == {units["budget"]}


def test_the_names_an_error_says_a_hybrid_misses_include_parameters_an_adapter_check_found_apart():
    """A hybrid learns the changed files that bring or drop what its error names: an attribute, an
    imported name, a keyword, and the parameters kvparity's adapter check found on one side only."""
    from kvparity.run.explain import _misfit_callees, _missing_names

    assert _missing_names("AttributeError: 'Req' object has no attribute 'swa_uuid'") == {"swa_uuid"}
    assert _missing_names("ImportError: cannot import name 'mxfp_supported' from 'sglang.srt.utils'") == {"mxfp_supported"}
    assert _missing_names("TypeError: Can't instantiate abstract class UnifiedRadixCache with abstract methods "
                          "checkpoint, release") == {"checkpoint", "release"}
    assert _missing_names("matches no SGLang generation kvparity drives: the nearest is ..., as in 0.5.21, where "
                          "sglang.srt.mem_cache.common:checkpoint_kv_cache is present") == {"checkpoint_kv_cache"}
    assert _missing_names("ScheduleBatch.release_req takes ['idx', 'remaing_req_count', 'server_args'], the entry "
                          "says ['idx', 'remaing_req_count', 'server_args', 'offload_kv']") == {"offload_kv"}
    # A's text may use the parameter's name elsewhere (0.5.17's schedule_batch.py does): the function
    # itself is named too, so B's definition (and callers) of it are learnt.
    assert _misfit_callees("ScheduleBatch.release_req takes ['idx'], the entry says ['idx', 'offload_kv']") == {
        "release_req"}
    assert _misfit_callees("TypeError: RadixKey.__init__() got an unexpected keyword argument 'cache_salt'") == {"RadixKey"}


def test_a_hybrid_the_probe_finds_still_holding_a_module_b_removed_learns_that_removal(tmp_path):
    """Between two generations (0.5.21 -> 0.5.22 removed the chunk cache) a hybrid can fit no
    entry: the probe says a module B removed is still present, so B's removal of it is taken."""
    from kvparity.run.explain import Explanation, _Search

    (tmp_path / "a" / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "b" / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "a" / "sglang" / "srt" / "chunk_cache.py").write_text("class ChunkCache:\n    pass\n")
    (tmp_path / "a" / "sglang" / "srt" / "other.py").write_text("X = 1\n")
    (tmp_path / "b" / "sglang" / "srt" / "other.py").write_text("X = 2\n")
    search = _Search(str(tmp_path / "a"), str(tmp_path / "b"), None, None, Explanation("a", "b"), print)
    search.candidates = tuple(changed_files(tmp_path / "a", tmp_path / "b"))
    line = "matches no SGLang generation ..., as in 0.5.23, where sglang.srt.chunk_cache is present"
    assert search._providers(line, ()) == {"sglang/srt/chunk_cache.py"}
    assert search._providers(line.replace("is present", "is missing"), ()) == set()


def _search_over_one_module(tmp_path, path, a, b):
    """A search of B's changes to one module (``a`` -> ``b``), and the module's changed units by name."""
    from kvparity.run.explain import Explanation, _Search

    for name, text in (("a", a), ("b", b)):
        (tmp_path / name / path).parent.mkdir(parents=True)
        (tmp_path / name / path).write_text(text)
    search = _Search(str(tmp_path / "a"), str(tmp_path / "b"), None, None, Explanation("a", "b"), print)
    search.candidates = tuple(changed_files(tmp_path / "a", tmp_path / "b"))
    units = {u.name: u for u in function_changes(path, a, b)}
    search.all_units = tuple(units.values())
    return search, units


def test_a_hybrid_that_raised_in_a_function_it_took_from_a_learns_b_s_version_of_it(tmp_path):
    """``unsupported operand type(s) for -=: 'NoneType' and 'int'`` names nothing; where the
    scheduler stopped does: A's ``budget`` met B's data, so B's ``budget`` (not ``other``) is taken."""
    search, units = _search_over_one_module(tmp_path, "sglang/m.py",
                                            "def budget(n):\n    return n\n\n\ndef other():\n    return 0\n",
                                            "def budget(n):\n    return n - 1\n\n\ndef other():\n    return 1\n")
    line = "iteration 1: the scheduler raised TypeError: unsupported operand type(s) (at sglang/m.py:2 in budget)"
    assert search._unit_providers(line, set()) == {units["budget"]}
    assert search._unit_providers(line, {units["budget"]}) == set()
    assert search._providers(line, ()) == {"sglang/m.py"}


def test_a_class_whose_init_lost_a_parameter_is_learnt_by_its_definition(tmp_path):
    """0.5.18 dropped ``server_args`` from ``SchedulerInvariantChecker``: B's caller meets A's class,
    ``SchedulerInvariantChecker.__init__() missing 1 required keyword-only argument: 'server_args'``;
    B's class file (``class Checker:``, no call of it) and its ``__init__`` are what the hybrid lacks."""
    search, units = _search_over_one_module(
        tmp_path, "sglang/checker.py", "class Checker:\n    def __init__(self, *, server_args):\n        self.args = server_args\n",
        "class Checker:\n    def __init__(self):\n        self.args = None\n")
    line = "TypeError: Checker.__init__() missing 1 required keyword-only argument: 'server_args'"
    assert search._providers(line, ()) == {"sglang/checker.py"}
    assert search._unit_providers(line, set()) == {units["Checker.__init__"]}


def test_a_companion_learnt_from_an_import_error_stays_in_every_hybrid_of_the_companion_search(tmp_path):
    """B's ``start`` needs B's module-level ``STEP`` (a NameError without it) and carries the
    difference; B's ``log`` needs ``start`` (it sets ``logged``). The function search keeps ``log``,
    with ``<module>`` and ``start`` as companions; A with the companions alone differs, so they are
    searched. ``<module>`` was learnt from an import error and A with it alone agrees with A: it stays
    in every hybrid, and the search names ``start`` alone (without that rule, every hybrid with
    ``start`` but no ``STEP`` fails to run, and the answer is ``<module>`` and ``start``)."""
    from kvparity.run.explain import CULPRIT

    b = "STEP = 3\n\n\n" + ADDER.replace(
        "    def log(self, n):\n        return n\n", "    def log(self, n, stamp=0):\n        self.logged += n\n        return n\n"
    ).replace("        self.budget = 10\n", "        self.budget = 5 * STEP // 3\n        self.logged = 0\n")
    found = _explain_adder(tmp_path, b)
    assert found.status == CULPRIT and [f.name for f in found.functions] == ["Adder.start"], found.lines()
    assert found.companions == ("sglang/m.py: <module>",)


@pytest.mark.parametrize(("b_module", "kept"), [("LIMIT = 10\nSTEP = 3\n", True), ("LIMIT = 5\nSTEP = 3\n", False)],
                         ids=["it only adds a name", "it carries the difference"])
def test_a_companion_learnt_from_an_import_error_is_kept_only_where_alone_it_changes_nothing(tmp_path, b_module, kept):
    from pathlib import Path

    from kvparity.judge.verdict import Played
    from kvparity.run.explain import MODULE_REST, _kept_for_imports

    search, units = _search_over_one_module(tmp_path, "sglang/m.py", "LIMIT = 10\n", b_module)

    class Replayer:
        def play(self, folder):
            space: dict = {}
            exec((Path(folder) / "sglang" / "m.py").read_text(), space)
            return Played(None, space["LIMIT"] == 10, None if space["LIMIT"] == 10 else "x", f"limit {space['LIMIT']}")

        def same(self, played, first):
            return played.line == first.line

        def broken(self, played):
            return None

    search.replayer, search.first = Replayer(), Played(None, False, "x", "limit 5")
    module = {units[MODULE_REST]}
    assert _kept_for_imports(module, search) == (module if kept else set())

"""Root conftest.

- Fixes the Triton mode before anything imports Triton (``kernels.runtime``).
- Gives each pytest-xdist worker its own Triton cache directory: compiled kernels written
  concurrently by several workers into one cache can collide.
- Registers the Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (``ci`` when ``CI=true``,
  else ``dev``): ``ci`` derandomized and bounded, ``dev`` random, ``nightly`` random with its seed
  printed and larger shapes, ``mutation`` derandomized without a database.
- Keeps a ledger of the scenarios each world played and prints it at the end; under the ``ci``
  and ``nightly`` profiles a full property run that missed a required scenario class fails.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile

# The controller picks one base directory (the user's TRITON_CACHE_DIR, or a fresh temporary one);
# workers inherit it through the environment and each takes its own sub-directory.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
# Folders this process made (not inherited through the environment): removed when it ends, so a
# run leaves no kvparity-* folders behind in the temporary directory.
_MADE: list[str] = []


def _made(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    _MADE.append(path)
    return path


# explain keeps the hybrids it played (a stopped search resumes): never the user's, in a test.
os.environ["KVPARITY_EXPLAIN_CACHE"] = _made("kvparity-explain-")

if "KVPARITY_TRITON_CACHE_BASE" not in os.environ:
    os.environ["KVPARITY_TRITON_CACHE_BASE"] = os.environ.get("TRITON_CACHE_DIR") or _made("kvparity-triton-")
_base = os.environ["KVPARITY_TRITON_CACHE_BASE"]
os.environ["TRITON_CACHE_DIR"] = os.path.join(_base, f"worker-{_worker}")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvparity.kernels import runtime  # noqa: E402  (decides TRITON_INTERPRET before triton is imported)

# isort: split

import pytest  # noqa: E402
import torch  # noqa: E402

from kvparity.model import (
    ledger,
    profiles,  # noqa: E402
)
from kvparity.model.classes import NIGHTLY_EXTRA, REQUIRED  # noqa: E402

PROFILE = profiles.chosen_profile()
try:
    profiles.load(PROFILE)
except ValueError as exc:
    raise pytest.UsageError(str(exc)) from None

PROPERTY_FILE = "tests/properties/test_parity.py"


def pytest_configure(config):
    if ledger.ENV not in os.environ:
        os.environ[ledger.ENV] = _made("kvparity-ledger-")
    if PROFILE == "nightly":
        # A random seed, printed, shared by every worker (they inherit the environment).
        seed = int(os.environ.setdefault("KVPARITY_SEED", str(random.getrandbits(32))))
        from hypothesis import core

        core.global_force_seed = seed


def pytest_report_header(config):
    seed = f", seed {os.environ['KVPARITY_SEED']}" if PROFILE == "nightly" else ""
    return f"kvparity: {runtime.describe()}; hypothesis profile {PROFILE}{seed}"


def _required() -> tuple[str, ...]:
    return REQUIRED + NIGHTLY_EXTRA if PROFILE == "nightly" else REQUIRED


def _full_property_run(terminalreporter) -> bool:
    passed = [r.nodeid for r in terminalreporter.stats.get("passed", []) if r.nodeid.startswith(PROPERTY_FILE)]
    from kvparity.model.strategies import TEMPLATES

    # A run with KVPARITY_MAX_EXAMPLES is a time-boxed one: report, do not enforce.
    enforced = PROFILE in ("ci", "nightly") and not os.environ.get("KVPARITY_MAX_EXAMPLES")
    return enforced and len({n for n in passed if "test_all_worlds_agree" in n}) >= len(TEMPLATES)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    entries = ledger.read(os.environ[ledger.ENV])
    if not entries:
        return
    terminalreporter.write_line("")
    for line in ledger.summary_lines(entries, _required()):
        terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    entries = ledger.read(os.environ[ledger.ENV])
    _, per_class = ledger.tally(entries)
    missing = [c for c in _required() if not per_class[c]]
    if missing and _full_property_run(reporter):
        reporter.write_line(f"kvparity: the {PROFILE} profile never reached: {', '.join(missing)}", red=True)
        session.exitstatus = 1


def pytest_unconfigure(config):
    import shutil

    for path in _MADE:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def device() -> torch.device:
    return runtime.DEVICE


@pytest.fixture(params=runtime.BACKENDS)
def backend(request) -> str:
    return request.param


# Real 0.5.3 and 0.5.3.post1 with the scheduler plugins (the policy probe and SGLang's own loop),
# one worker per release per test process: starting one costs seconds.
SCHEDULER_PLUGINS = ("kvparity.engine.real.policy_probe", "kvparity.engine.real.scheduler_shell")


@pytest.fixture
def keep_hypothesis_profile():
    """``kvparity check`` loads its own Hypothesis profile; give the suite's back afterwards."""
    from hypothesis import settings

    before = settings.default
    yield
    settings.register_profile("_kvparity_restore", before)
    settings.load_profile("_kvparity_restore")


# Release workers a test process keeps warm at once (``release_workers``): starting one costs about
# 5 CPU seconds, and seven modules ask for 0.5.23; each holds SGLang's modules in memory.
WARM_RELEASE_WORKERS = 6


@pytest.fixture(scope="session")
def release_workers(scheduler_workers):
    """A scheduler-shell worker per release, started when first asked for and shared by every test
    of the process (0.5.3 and 0.5.3.post1: the session's scheduler workers); the least recently
    asked for is closed past ``WARM_RELEASE_WORKERS``. A release that cannot be had skips the test."""
    from kvparity.engine.errors import RealSGLangError
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.worker import RealWorker

    started: dict = {}  # in the order last asked for

    def get(release: str):
        if release in scheduler_workers:
            return scheduler_workers[release]
        if release not in started:
            try:
                source = resolve(release)
            except RealSGLangError as exc:
                pytest.skip(f"cannot get a real sglang {release}: {exc}")
            if len(started) >= WARM_RELEASE_WORKERS:
                started.pop(next(iter(started))).close()
            started[release] = RealWorker(source, plugins=("kvparity.engine.real.scheduler_shell",))
        started[release] = started.pop(release)
        return started[release]

    yield get
    for worker in started.values():
        worker.close()


@pytest.fixture
def mutant_judged(release_workers, tmp_path):
    """``judged(name, scenario)``: a mutated copy of a release (``real_zoo``) against the release it
    mutates, on one traffic scenario: the judgement and the copy's run. It asserts first that the
    release against itself agrees (the difference is the mutant's)."""
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.players import RealTrafficPlayer
    from kvparity.judge.admission import judge_traffic
    from kvparity.teeth.real_zoo import REAL_MUTANTS_BY_NAME, make_mutated_copy

    def judged(name, scenario):
        mutant = REAL_MUTANTS_BY_NAME[name]
        release = RealTrafficPlayer(resolve(mutant.against), release_workers(mutant.against))
        copy = tmp_path / name  # made once, played as often as the test asks
        broken = RealTrafficPlayer(resolve(str(copy if copy.exists() else
                                               make_mutated_copy(resolve(mutant.version), mutant, copy))))
        try:
            theirs, ours = release.play(scenario), broken.play(scenario)
            assert judge_traffic(scenario, theirs, release.play(scenario), release.world_id, release.world_id).agree
            return judge_traffic(scenario, theirs, ours, release.world_id, broken.world_id), ours
        finally:
            broken.close()

    return judged


@pytest.fixture(scope="session")
def scheduler_workers():
    from kvparity.engine.real.install import resolve
    from kvparity.engine.real.worker import RealWorker

    started = {v: RealWorker(resolve(v), plugins=SCHEDULER_PLUGINS) for v in ("0.5.3", "0.5.3.post1")}
    yield started
    for worker in started.values():
        worker.close()

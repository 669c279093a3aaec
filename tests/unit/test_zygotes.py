"""Warm workers (``kvparity/engine/real/zygote.py``): inside ``Zygotes``, a real-SGLang worker is
forked from the release's zygote instead of importing SGLang again; it serves calls as a spawned
worker does, its death still names its signal, and it comes back forked; a zygote that cannot
serve leaves the worker to be spawned, as outside ``Zygotes``."""

from __future__ import annotations

import json
import os
import signal

import pytest

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real import WORKER_PLUGINS, install, zygote
from kvparity.engine.real.lane import RealLane
from kvparity.engine.real.worker import RealWorker, WorkerDied
from kvparity.golden.scenarios import GOLDENS
from kvparity.run.runner import run_scenario

RELEASE = "0.5.3"


@pytest.fixture(scope="module")
def source():
    try:
        return install.resolve(RELEASE)
    except RealSGLangError as exc:
        pytest.skip(f"cannot get a real sglang {RELEASE}: {exc}")


def test_a_worker_is_forked_from_the_zygote_and_comes_back_forked_after_a_crash(source):
    with zygote.Zygotes([source], WORKER_PLUGINS), RealWorker(source, plugins=WORKER_PLUGINS) as worker:
        info = worker.start()
        assert info["forked_from"] != info["pid"] and info["version"] == RELEASE
        assert worker.call("echo", a=1) == {"a": 1}
        with pytest.raises(WorkerDied) as died:
            worker.call("crash", how="signal", code=int(signal.SIGSEGV))
        # SIGSEGV, or the abort a library's own handler turns it into after faulthandler's report
        # (the scheduler shell's plugin, loaded by every worker, brings such a library along).
        assert died.value.signal in (signal.SIGSEGV, signal.SIGABRT), str(died.value)
        assert "Segmentation fault" in died.value.stderr_tail, died.value.stderr_tail
        assert worker.call("echo", b=2) == {"b": 2}  # restarted, forked again from the same zygote
        assert worker.info["forked_from"] == info["forked_from"] and worker.starts == 2


def test_without_zygotes_the_worker_is_spawned(source):
    with RealWorker(source, plugins=WORKER_PLUGINS) as worker:
        assert "forked_from" not in worker.start()


def test_a_zygote_that_cannot_serve_leaves_the_worker_to_be_spawned(source, monkeypatch, tmp_path):
    path = str(tmp_path / "z.sock")
    zygote.refuse(path, "a reason")
    monkeypatch.setenv(zygote.ENV, json.dumps({zygote.source_key(source, WORKER_PLUGINS): path}))
    with pytest.raises(zygote.Unavailable, match="a reason"):  # said at once, not after a wait
        zygote.socket_for(zygote.source_key(source, WORKER_PLUGINS), timeout=0.5)
    with RealWorker(source, plugins=WORKER_PLUGINS) as worker:
        assert "forked_from" not in worker.start()


def test_forked_worlds_play_a_golden_as_spawned_ones_do(source):
    scenario = GOLDENS["chunked-radix-cache"]
    with RealLane([RELEASE], ("torch",)) as lane:
        spawned = run_scenario(scenario, (("legacy", "torch"),), lane=lane)
    with zygote.Zygotes([source], WORKER_PLUGINS), RealLane([RELEASE], ("torch",)) as lane:
        forked = run_scenario(scenario, (("legacy", "torch"),), lane=lane)
        assert lane.workers[lane.labels[0]].info["forked_from"] != os.getpid()
    assert spawned.ok and forked.ok and spawned.stages == forked.stages


def test_only_the_named_real_worlds_play(source):
    with RealLane([RELEASE], ("torch", "triton")) as lane:
        played = lane.play(GOLDENS["chunked-radix-cache"], only=frozenset({f"sglang-{RELEASE}/torch"}))
    assert list(played) == [f"sglang-{RELEASE}/torch"]


def test_a_fresh_command_forks_working_triton_worlds(source):
    """As a user runs it: a new process, whose zygotes start before it has imported the kernels
    (so before TRITON_INTERPRET is set here); the forked Triton worlds must still run."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPARITY_", "TRITON_INTERPRET"))}
    done = subprocess.run([sys.executable, "-m", "kvparity", "check", "--sglang", "0.5.3.post1", "--against", RELEASE,
                           "--backend", "triton", "--examples", "10", "--seed", "0", "--jobs", "2"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "verdict (harness-driven): PARITY" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_a_folder_whose_sglang_does_not_import_exits_2_at_once(source, tmp_path, capsys):
    """Not a divergence to shrink (every candidate would start a failing worker): one sentence, exit 2."""
    from kvparity.cli.main import main

    from checkout_cases import _checkout, _edit

    copy = _checkout(RELEASE, tmp_path)
    # Raised on import, the file still parses (the probe reads it as a syntax tree, and finds what it looks for).
    _edit(copy / "sglang/srt/mem_cache/allocator.py", "from __future__ import annotations\n",
          "from __future__ import annotations\nraise ImportError('broken on purpose')\n")
    assert main(["check", "--sglang", str(copy), "--against", RELEASE, "--backend", "torch", "--examples", "10"]) == 2
    err = capsys.readouterr().err
    assert "broken on purpose" in err and "Traceback" not in err

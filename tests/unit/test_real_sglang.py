"""Real SGLang as a kvparity world (kvparity/real): install, version table, stand-ins, worker.

Real SGLang only ever runs inside worker subprocesses; this process imports none of it. The worker
tests install sglang 0.5.3 and 0.5.3.post1 on first use (``pip install --no-deps --target``, cached
under ``~/.cache/kvparity/sglang``; ``KVPARITY_SGLANG_WHEELS=DIR`` for an offline wheel folder) and
skip, saying why, when that cannot be done.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real import install, standins, versions
from kvparity.engine.real.worker import RealWorker, RemoteError, WorkerDied, WorkerHung
from kvparity.engine.release_order import version_key
from kvparity.engine.releases import release
from kvparity.model.poison import POISON

# The versions the worker tests drive (KVPARITY_REAL_SGLANG_VERSIONS=0.5.3,0.5.4 to choose).
WORKER_VERSIONS = tuple(
    v.strip() for v in os.environ.get("KVPARITY_REAL_SGLANG_VERSIONS", "0.5.3,0.5.3.post1").split(",") if v.strip()
)
BACKENDS = ("triton", "torch")


# --------------------------------------------------------------------------- versions


# parse_version's accepted and refused forms: tests/unit/test_checkouts.py.


@pytest.mark.parametrize(
    "version, nearest",
    [("0.5.2", "0.5.3"), ("0.4.0", "0.5.3"), ("0.5.3.post9", "0.5.3.post3"), ("0.5.5.post9", "0.5.5.post3"), ("1.0.0", "0.5.23"),
     ("0.5.3rc1", "0.5.3")],
)
def test_unsupported_version_is_refused_naming_the_nearest(version, nearest):
    with pytest.raises(RealSGLangError, match=rf"not supported.*nearest supported version is {nearest}$"):
        versions.entry(version)


def test_version_table():
    assert set(versions.SUPPORTED) >= {"0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4"}
    fam = {v: e.family for v, e in versions.SUPPORTED.items()}
    assert fam.pop("0.5.3") == "legacy" and set(fam.values()) == {"refactored"}
    e = versions.SUPPORTED
    assert e["0.5.3"].write_cache_indices is None
    assert e["0.5.3.post1"].write_cache_indices.endswith(":ScheduleBatch.write_cache_indices")
    assert e["0.5.3.post2"].write_cache_indices == "sglang.srt.mem_cache.common:write_cache_indices"
    assert [e[v].globals_style for v in ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4", "0.5.21")] == [
        "dict", "dict", "server_args", "server_args", "server_args"]
    assert e["0.5.3"].label == "sglang-0.5.3"
    assert not e["0.5.3"].prefill_only_possible and e["0.5.3.post1"].prefill_only_possible
    assert e["0.5.4"].oom_kind("Out of memory. Try to lower your batch size.\n...") == "extend_1"
    assert e["0.5.3"].oom_kind("Prefill out of memory. Try to lower your batch size.") == "extend_1"
    assert e["0.5.3"].oom_kind("something else") is None


# --------------------------------------------------------------------------- install


class FakePip:
    """Counts pip calls; "installs" a minimal sglang package into --target (or fails). The package has
    no code, so the install tests resolve with ``check_supported=False``: resolve would otherwise
    probe it (``install._checked``) and refuse it, as it refuses any code no adapter entry fits."""

    def __init__(self, returncode: int = 0, output: str = "", write: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.returncode, self.output, self.write = returncode, output, write

    def __call__(self, args):
        self.calls.append(list(args))
        target = Path(args[args.index("--target") + 1])
        version = args[-1].split("==", 1)[1]
        if self.write:
            (target / "sglang").mkdir(parents=True, exist_ok=True)
            (target / "sglang" / "__init__.py").write_text("")
            (target / "sglang" / "version.py").write_text(f'__version__ = "{version}"\n')
        return install.PipResult(self.returncode, self.output)


@pytest.fixture
def no_wheels(monkeypatch):
    monkeypatch.delenv(install.ENV_WHEELS, raising=False)


def test_resolve_installs_once_then_reuses_the_cache(tmp_path, no_wheels):
    pip = FakePip()
    first = install.resolve("sglang==0.5.3", cache_dir=tmp_path, pip=pip, check_supported=False)
    assert (first.version, first.origin) == ("0.5.3", "pip")
    assert Path(first.path) == (tmp_path / "0.5.3").resolve()
    args = pip.calls[0]
    assert args[:2] == ["install", "--no-deps"] and "--target" in args and args[-1] == "sglang==0.5.3"
    second = install.resolve("0.5.3", cache_dir=tmp_path, pip=pip, check_supported=False)
    assert len(pip.calls) == 1, "the second resolve must not call pip"
    assert (second.path, second.origin) == (first.path, "cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.5.3"]  # no partial folder left


def test_default_cache_follows_xdg(tmp_path, monkeypatch, no_wheels):
    monkeypatch.delenv(install.ENV_CACHE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert install.cache_root() == tmp_path / "kvparity" / "sglang"
    src = install.resolve("0.5.3.post1", pip=FakePip(), check_supported=False)
    assert Path(src.path).parent == (tmp_path / "kvparity" / "sglang").resolve()


def test_failed_pip_leaves_nothing_to_reuse(tmp_path, no_wheels):
    pip = FakePip(returncode=1, output="ERROR: Could not find a version\nERROR: No matching distribution found for sglang==0.5.3")
    with pytest.raises(RealSGLangError, match=r"^pip could not install sglang==0\.5\.3 from PyPI.*No matching distribution"):
        install.resolve("0.5.3", cache_dir=tmp_path, pip=pip)
    assert list(tmp_path.iterdir()) == []  # the half install (pip wrote files, then failed) is gone
    good = FakePip()
    assert install.resolve("0.5.3", cache_dir=tmp_path, pip=good, check_supported=False).origin == "pip"
    assert len(good.calls) == 1


def test_damaged_cache_entry_is_reinstalled(tmp_path, no_wheels):
    (tmp_path / "0.5.3" / "sglang").mkdir(parents=True)  # no version.py: not a finished install
    pip = FakePip()
    assert install.resolve("0.5.3", cache_dir=tmp_path, pip=pip, check_supported=False).origin == "pip"
    assert len(pip.calls) == 1


def test_unsupported_version_is_refused_before_pip(tmp_path, no_wheels):
    pip = FakePip()
    with pytest.raises(RealSGLangError, match="nearest supported version is 0.5.4"):
        install.resolve("0.5.4.post9", cache_dir=tmp_path, pip=pip)
    with pytest.raises(RealSGLangError, match="nearest supported version is 0.5.3$"):
        install.resolve("0.5.2", cache_dir=tmp_path, pip=pip)
    assert pip.calls == []


def test_wheel_folder_installs_offline(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv(install.ENV_WHEELS, str(wheels))
    pip = FakePip()
    install.resolve("0.5.3", cache_dir=tmp_path / "cache", pip=pip, check_supported=False)
    args = pip.calls[0]
    assert "--no-index" in args and args[args.index("--find-links") + 1] == str(wheels)
    monkeypatch.setenv(install.ENV_WHEELS, str(tmp_path / "missing"))
    with pytest.raises(RealSGLangError, match="wheel folder .* does not exist"):
        install.resolve("0.5.3.post1", cache_dir=tmp_path / "cache", pip=pip)


def test_resolve_a_path(tmp_path):
    folder = tmp_path / "python"
    (folder / "sglang").mkdir(parents=True)
    (folder / "sglang" / "__init__.py").write_text("raise ImportError('never imported by resolve')\n")
    (folder / "sglang" / "version.py").write_text('__version__ = "0.5.3.post1"\n')
    src = install.resolve(str(folder), check_supported=False)
    assert (src.version, src.origin, Path(src.path)) == ("0.5.3.post1", "path", folder.resolve())
    with pytest.raises(RealSGLangError, match="does not exist"):
        install.resolve(str(tmp_path / "nowhere"))
    with pytest.raises(RealSGLangError, match="holds no sglang package"):
        install.resolve(str(tmp_path))
    # A folder is driven by what its code is, not by its version (tests/unit/test_checkouts.py):
    # this one has no code, so no adapter entry fits it.
    with pytest.raises(RealSGLangError, match=r"\(version 0\.5\.3\.post1\) matches no SGLang generation kvparity drives"):
        install.resolve(str(folder))


# --------------------------------------------------------------------------- stand-ins


@pytest.fixture
def standin_sandbox(tmp_path):
    """Stand-ins for a test-only package name, and a folder for modules that import it; both are
    removed afterwards (this process never sees SGLang's real stand-in table)."""
    name = "kvparity_standin_probe_pkg"
    installed = standins.install({name: standins.StandIn("a test-only module", False)})
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, tmp_path, installed
    finally:
        installed.uninstall()
        sys.path.remove(str(tmp_path))
        for key in [k for k in sys.modules if k.startswith((name, "kvparity_standin_user"))]:
            del sys.modules[key]


def test_standin_allows_import_and_raises_on_use(standin_sandbox):
    import importlib

    name, folder, installed = standin_sandbox
    (folder / "kvparity_standin_user.py").write_text(
        f"from {name}.sub import Base, helper\n"  # what SGLang's module bodies do
        "ROUTE = helper('route')\n"
        "@helper.decorate(1)\n"
        "def handler():\n    return 1\n"
    )
    user = importlib.import_module("kvparity_standin_user")
    pkg = sys.modules[f"{name}.sub"]
    assert standins.is_standin(pkg) and installed.used() == [name, f"{name}.sub"]
    with pytest.raises(standins.StandInUsed) as use:
        pkg.Tokenizer  # noqa: B018 - an attribute read after import
    message = str(use.value)
    assert f"'{name}.sub'" in message and "a test-only module" in message
    assert "test_real_sglang.py" in message and "test_standin_allows_import_and_raises_on_use" in message
    with pytest.raises(standins.StandInUsed, match=rf"'{name}\.sub\.helper\(\)' was used \(calling it\)"):
        user.ROUTE()
    with pytest.raises(standins.StandInUsed, match="calling it"):
        user.handler()  # the stand-in decorator replaced it
    with pytest.raises(standins.StandInUsed, match="truth test"):
        bool(user.ROUTE)


def test_standin_classes_raise_when_instantiated(standin_sandbox):
    import importlib

    name, folder, _ = standin_sandbox
    (folder / "kvparity_standin_user.py").write_text(
        f"from {name} import PretrainedConfig, field_validator\n"
        "class MyConfig(PretrainedConfig, total=False):\n"
        "    x: int = 1\n"
        "    @field_validator('x')\n"
        "    def check(cls, v):\n        return v\n"
    )
    user = importlib.import_module("kvparity_standin_user")  # import-time use is fine
    with pytest.raises(standins.StandInUsed, match=rf"'{name}\.PretrainedConfig'.*instantiating MyConfig"):
        user.MyConfig()
    with pytest.raises(standins.StandInUsed, match=r"reading MyConfig\.from_pretrained"):
        user.MyConfig.from_pretrained  # noqa: B018
    assert user.MyConfig.x == 1  # its own class body is real


def test_standin_table_never_hides_a_try_except_import():
    assert not set(standins.STANDINS) & set(standins.NEVER_STAND_IN)
    with pytest.raises(RealSGLangError, match="fallback"):
        standins.install({"sgl_kernel": standins.StandIn("no", False)})
    for name, entry in standins.STANDINS.items():
        assert entry.reason, name


# --------------------------------------------------------------------------- worker: protocol


@pytest.fixture(scope="module")
def bare_worker():
    worker = RealWorker(bare=True, call_timeout=30)
    worker.start()
    yield worker
    worker.close()


def test_worker_killed_mid_call_is_reported_dead_then_restarts(bare_worker):
    pid = bare_worker.pid
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(WorkerDied) as died:
        bare_worker.call("sleep", seconds=30)
    assert died.value.signal == signal.SIGKILL and died.value.method == "sleep"
    assert str(died.value).startswith("the bare worker died (signal 9 SIGKILL) during sleep")
    assert not bare_worker.alive
    assert bare_worker.call("echo", x=[1, 2]) == {"x": [1, 2]}  # a fresh worker
    assert bare_worker.pid != pid


def test_worker_exit_and_signals_are_reported(bare_worker):
    with pytest.raises(RemoteError, match="no remote method"):
        bare_worker.call("no_such_method")
    with pytest.raises(WorkerDied, match=r"^the bare worker died \(exit code 3\) during crash$") as died:
        bare_worker.call("crash", how="exit", code=3)
    assert (died.value.exit_code, died.value.signal) == (3, None)
    with pytest.raises(WorkerDied, match=r"\(signal 11 SIGSEGV\) during crash") as died:
        bare_worker.call("crash", how="signal", code=signal.SIGSEGV)
    assert "Fatal Python error: Segmentation fault" in died.value.stderr_tail  # faulthandler's stack


def test_hung_call_is_reported_within_the_timeout(bare_worker):
    bare_worker.call("echo")
    t0 = time.monotonic()
    with pytest.raises(WorkerHung, match=r"^the bare worker hung for more than 1 s during sleep"):
        bare_worker.call("sleep", seconds=60, timeout=1.0)
    assert time.monotonic() - t0 < 4
    assert not bare_worker.alive
    assert bare_worker.call("sleep", seconds=0) == 0


# --------------------------------------------------------------------------- worker: real SGLang


def _source(version: str) -> install.SGLangSource:
    try:
        return install.resolve(version)
    except RealSGLangError as exc:
        pytest.skip(f"cannot get a real sglang {version}: {exc}")


@pytest.fixture(scope="module", params=WORKER_VERSIONS)
def real_worker(request):
    worker = RealWorker(_source(request.param), call_timeout=120)
    try:
        worker.start()
    except RealSGLangError as exc:  # pragma: no cover - reported, not hidden
        pytest.fail(f"the sglang {request.param} worker did not start: {exc}")
    yield worker
    worker.close()


def _geometry(page_size: int) -> dict:
    return {"pool_rows": 4, "max_context_len": 16, "kv_slots": 32, "page_size": page_size, "need_sort": False}


_SMOKE: dict[tuple, dict] = {}


def _smoke(worker: RealWorker, backend: str, cache_kind: str, page_size: int) -> dict:
    key = (worker.source.version, backend, cache_kind, page_size)
    if key not in _SMOKE:
        _SMOKE[key] = worker.call("smoke", backend=backend, geometry=_geometry(page_size), cache_kind=cache_kind)
    return _SMOKE[key]


def test_worker_runs_the_real_package(real_worker):
    info = real_worker.call("hello")
    version = real_worker.source.version
    assert (info["version"], info["label"]) == (version, f"sglang-{version}")
    assert info["family"] == versions.entry(version).family
    assert info["triton_interpret"] is True or info["device"].startswith("cuda")
    assert info["absent"] == ["sgl_kernel", "torch_memory_saver"]  # their CPU fallback is used
    assert "transformers" in info["standin_table"] and 0 < info["import_s"] < 60
    assert "sglang" not in sys.modules  # never in this process


P = POISON


def _row(*values: int) -> list[int]:
    return list(values) + [P] * (16 - len(values))


EMPTY = _row()
# Hand-computed from SPEC sections 1 and 6 for the smoke sequence (kvparity/engine/real/smoke.py) with
# pool_rows 4, max_context_len 16, kv_slots 32, need_sort False. Same for 0.5.3 and 0.5.3.post1,
# both backends.
EXPECTED = {
    ("radix", 1): {
        "extend": dict(out_cache_loc=list(range(1, 14)), last_loc=None, free_pages=list(range(14, 33)),
                       table=[_row(1, 2, 3, 4, 5, 6), _row(7, 8, 9, 10, 11, 12, 13), EMPTY, EMPTY], tree=[]),
        "prefill_result": dict(
            free_pages=list(range(14, 33)) + [7, 8, 9, 10],  # b's copy of the shared prefix is freed
            table=[_row(1, 2, 3, 4, 5, 6), _row(1, 2, 3, 4, 11, 12, 13), EMPTY, EMPTY],
            tree=[[None, [1, 2, 3, 4], [1, 2, 3, 4], 2], [None, [1, 2, 3, 4, 5, 6], [5, 6], 1],
                  [None, [1, 2, 3, 4, 7, 8, 9], [11, 12, 13], 1]]),
        "decode": dict(out_cache_loc=[14, 15], last_loc=None, free_pages=list(range(16, 33)) + [7, 8, 9, 10],
                       table=[_row(1, 2, 3, 4, 5, 6, 14), _row(1, 2, 3, 4, 11, 12, 13, 15), EMPTY, EMPTY]),
        "retract": dict(free_pages=list(range(16, 33)) + [7, 8, 9, 10, 15], free_rows=[2, 3, 1],
                        tree=[[None, [1, 2, 3, 4], [1, 2, 3, 4], 1], [None, [1, 2, 3, 4, 5, 6], [5, 6], 1],
                              [None, [1, 2, 3, 4, 7, 8, 9], [11, 12, 13], 0]]),
        "finish": dict(free_pages=list(range(16, 33)) + [7, 8, 9, 10, 15], free_rows=[2, 3, 1, 0],
                       table=[_row(1, 2, 3, 4, 5, 6, 14), _row(1, 2, 3, 4, 11, 12, 13, 15), EMPTY, EMPTY],
                       tree=[[None, [1, 2, 3, 4], [1, 2, 3, 4], 0], [None, [1, 2, 3, 4, 5, 6], [5, 6], 0],
                             [None, [1, 2, 3, 4, 5, 6, 100], [14], 0], [None, [1, 2, 3, 4, 7, 8, 9], [11, 12, 13], 0]]),
    },
    ("radix", 4): {  # pages 1..8; page p holds slots 4p..4p+3
        "extend": dict(out_cache_loc=[4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18], last_loc=[-1, -1],
                       free_pages=[5, 6, 7, 8]),
        "prefill_result": dict(free_pages=[3, 5, 6, 7, 8],  # b's duplicate page 3 goes to the front
                               table=[_row(4, 5, 6, 7, 8, 9), _row(4, 5, 6, 7, 16, 17, 18), EMPTY, EMPTY],
                               tree=[[None, [1, 2, 3, 4], [4, 5, 6, 7], 2]]),
        "decode": dict(out_cache_loc=[10, 19], last_loc=[9, 18], free_pages=[3, 5, 6, 7, 8]),
        "retract": dict(free_pages=[4, 3, 5, 6, 7, 8]),  # b's page 4 (its tail and decode slot)
        "finish": dict(free_pages=[2, 4, 3, 5, 6, 7, 8], free_rows=[2, 3, 1, 0],  # a's tail page 2
                       tree=[[None, [1, 2, 3, 4], [4, 5, 6, 7], 0]]),
    },
    ("chunk", 1): {
        "extend": dict(out_cache_loc=list(range(1, 14)), free_pages=list(range(14, 33))),
        "prefill_result": dict(free_pages=list(range(14, 33)), tree=[]),
        "decode": dict(out_cache_loc=[14, 15]),
        "retract": dict(free_pages=list(range(16, 33)) + [7, 8, 9, 10, 11, 12, 13, 15], free_rows=[2, 3, 1]),
        "finish": dict(free_pages=list(range(16, 33)) + [7, 8, 9, 10, 11, 12, 13, 15, 1, 2, 3, 4, 5, 6, 14],
                       table=[_row(1, 2, 3, 4, 5, 6, 14), _row(7, 8, 9, 10, 11, 12, 13, 15), EMPTY, EMPTY]),
    },
}
_STATE_KEYS = {"free_pages": "free_pages", "free_rows": "free_rows", "table": "req_to_token", "tree": "tree"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cache_kind, page_size", sorted(EXPECTED))
def test_smoke_matches_hand_computed_values(real_worker, backend, cache_kind, page_size):
    result = _smoke(real_worker, backend, cache_kind, page_size)
    version = real_worker.source.version
    assert (result["version"], result["world"]) == (f"sglang-{version}", f"sglang-{version}/{backend}")
    steps = {s["step"]: s for s in result["steps"]}
    assert list(steps) == ["extend", "prefill_result", "decode", "retract", "finish"]
    for step, expected in EXPECTED[(cache_kind, page_size)].items():
        got = steps[step]
        for key, want in expected.items():
            value = got[key] if key in ("out_cache_loc", "last_loc") else got["state"][_STATE_KEYS[key]]
            assert value == want, f"{version}/{backend} {cache_kind} ps={page_size} {step}: {key}"
    assert steps["extend"]["out_cache_loc_dtype"] == "torch.int64"
    assert steps["decode"]["check_decode_mem"] is True
    assert steps["retract"]["running"] == ["a"]
    b = steps["retract"]["requests"]["b"]
    assert b["is_retracted"] and b["prefix_values"] == []
    # 0.5.4's reset_for_retract keeps the index of the row the request gave back.
    assert b["req_pool_idx"] == (None if versions.entry(version).retract_clears_req_pool_idx else 1)


@pytest.mark.parametrize("cache_kind", ["radix", "chunk"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_smoke_poison_stays_where_nothing_wrote(real_worker, cache_kind, page_size):
    for backend in BACKENDS:
        for step in _smoke(real_worker, backend, cache_kind, page_size)["steps"]:
            table = step["state"]["req_to_token"]
            assert table[2] == table[3] == EMPTY, step["step"]  # rows nobody took
            written = {0: 7 if step["step"] in ("decode", "retract", "finish") else 6,
                       1: 8 if step["step"] in ("decode", "retract", "finish") else 7}
            for row, n in written.items():
                assert P not in table[row][:n] and table[row][n:] == [P] * (16 - n), (backend, step["step"], row)


def _normalised(result: dict, across_versions: bool = False) -> str:
    steps = json.loads(json.dumps(result["steps"]))
    for step in steps:
        for view in step["requests"].values():
            view.pop("prefix_kind"), view.pop("alias_row")  # may differ by design (SPEC section 7)
            if across_versions and view["is_retracted"]:
                view.pop("req_pool_idx")  # stale in 0.5.4 (VersionEntry.retract_clears_req_pool_idx)
    return json.dumps(steps, sort_keys=True)


@pytest.mark.parametrize("cache_kind", ["radix", "chunk"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_smoke_backends_agree_and_prefix_kinds_follow_the_version(real_worker, cache_kind, page_size):
    triton, torch_ = (_smoke(real_worker, b, cache_kind, page_size) for b in BACKENDS)
    assert _normalised(triton) == _normalised(torch_)
    entry = versions.entry(real_worker.source.version)
    kinds = [s["requests"]["a"]["prefix_kind"] for s in triton["steps"]]
    assert kinds[0] == "torch.int64 cpu tensor"  # match_prefix's empty tensor, both caches
    if cache_kind == "chunk" and entry.chunk_prefix == "int32 view":
        assert kinds[1:] == ["torch.int32 view of row 0"] * 4  # legacy aliases req_to_token
    else:
        assert kinds[1:] == ["torch.int64 cpu tensor"] * 4
    retracted = triton["steps"][3]["requests"]["b"]["prefix_kind"]
    assert retracted == ("list" if entry.prefix_default == "list" else "torch.int64 cpu tensor")
    # the versions agree too
    other = [k for k in _SMOKE if k[1:] == ("torch", cache_kind, page_size) and k[0] != real_worker.source.version]
    for key in other:
        assert _normalised(_SMOKE[key], True) == _normalised(torch_, True), key


def test_prefill_only_and_logprob_start_as_the_server_sets_them(real_worker):
    entry = versions.entry(real_worker.source.version)
    real_worker.call("build_world", name="w", backend="torch", geometry=_geometry(1), cache_kind="radix")
    plain = real_worker.call("new_req", world="w", name="r0", rid="r0", tokens=[1, 2, 3, 4])
    assert plain["logprob_start_len"] == 3 and not plain["is_prefill_only"]
    asked = real_worker.call("new_req", world="w", name="r1", rid="r1", tokens=[1, 2, 3, 4], return_logprob=True,
                             logprob_start_len=2)
    assert asked["logprob_start_len"] == 2
    clamped = real_worker.call("new_req", world="w", name="r2", rid="r2", tokens=[1, 2, 3, 4], return_logprob=True,
                               logprob_start_len=9)
    assert clamped["logprob_start_len"] == 3
    prefill = real_worker.call("new_req", world="w", name="r3", rid="r3", tokens=[1, 2, 3, 4], max_new_tokens=0)
    # 0.5.3 compares the global speculative algorithm (SpeculativeAlgorithm.NONE) with None.
    assert prefill["is_prefill_only"] is entry.prefill_only_possible
    assert prefill["logprob_start_len"] == (4 if entry.prefill_only_possible else 3)
    real_worker.call("drop")


def test_out_of_memory_is_sglangs_error(real_worker):
    tiny = dict(_geometry(1), kv_slots=8)
    with pytest.raises(RemoteError) as oom:
        real_worker.call("smoke", backend="torch", geometry=tiny, cache_kind="radix")
    assert oom.value.type == "RuntimeError" and oom.value.oom == "extend_1"
    wording = versions.entry(real_worker.source.version).oom_messages["extend_1"]
    assert oom.value.remote_message.startswith(wording)  # 0.5.3.post2+: "Out of memory." (no phase)
    assert real_worker.alive


def test_a_standin_used_in_the_worker_fails_the_call(real_worker):
    with pytest.raises(RemoteError) as used:
        real_worker.call("probe_standin", name="transformers", attr="AutoTokenizer")
    assert used.value.type == "StandInUsed" and "'transformers'" in used.value.remote_message
    assert real_worker.call("echo", ok=True) == {"ok": True}


# Every release of sglang on PyPI from 0.5.3 to 0.5.23 (pip index versions sglang, 2026-12-01).
RELEASES_0_5_3_TO_0_5_23 = (
    "0.5.3 0.5.3.post1 0.5.3.post2 0.5.3.post3 0.5.4 0.5.4.post1 0.5.4.post2 0.5.4.post3 0.5.5 0.5.5.post1 "
    "0.5.5.post2 0.5.5.post3 0.5.6 0.5.6.post1 0.5.6.post2 0.5.7 0.5.8 0.5.8.post1 0.5.9 0.5.10 0.5.10.post1 "
    "0.5.11 0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 0.5.14 0.5.15 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 "
    "0.5.20 0.5.21 0.5.22 0.5.23"
).split()


def test_every_release_is_driven_or_refused_with_its_reason():
    assert sorted(set(versions.SUPPORTED) | set(versions.NOT_DRIVEN), key=version_key) == RELEASES_0_5_3_TO_0_5_23
    assert not set(versions.SUPPORTED) & set(versions.NOT_DRIVEN)


def test_each_release_entry_is_the_one_before_plus_its_changes():
    ordered = [versions.SUPPORTED[v] for v in sorted(versions.SUPPORTED, key=version_key)]
    for before, after in zip(ordered, ordered[1:]):
        changed = {k for k, v in vars(after).items() if k != "version" and vars(before)[k] != v}
        assert changed == set(release(after.version).entry), after.version


def test_a_real_failure_names_the_step_its_play_marked_last():
    """A play marks its start (-1) and each step on the worker's stderr: a world that raised at a
    step is reported there, not "before the first step"; one that raised before its first step
    (its world's build) is, even where an earlier play's marks come before."""
    from kvparity.engine.real.lane import _where
    from kvparity.engine.real.play import STEP_MARK

    def marks(*indices):
        return "".join(f'{STEP_MARK}{{"index": {i}, "step": "s"}}\nan SGLang log line\n' for i in indices)

    assert _where(marks(-1, 0, 1, 2))[0] == 2
    assert _where(marks(-1, 0, 1, -1))[0] is None

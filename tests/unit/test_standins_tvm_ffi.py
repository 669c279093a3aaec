"""The ``tvm_ffi`` stand-in (SGLang 0.5.23+: ``class PushPlane(tvm_ffi.Object)`` at import of
``sglang/kernels/ops/communication/all_reduce.py``): the real package where it imports, else a stand-in that
lets the class statement run and raises ``StandInUsed`` on any later use. This process never keeps a
stand-in or the real package: each test puts back ``sys.modules`` and ``sys.meta_path`` as it found them."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kvparity.engine.real import standins

ROOT = Path(__file__).resolve().parents[2]
USER = "kvparity_tvm_ffi_user"

# What all_reduce.py does at import, in small: SGLang's lazy_register_class wraps __new__ of a tvm_ffi.Object
# subclass, and the module takes Module by name.
USER_SOURCE = '''
import tvm_ffi
from tvm_ffi import Module


def lazy_register_class(name, init_fn):
    def decorator(cls):
        def __new__(cls, *args, **kwargs):
            return original_new(cls)
        original_new = cls.__new__
        cls.__new__ = __new__
        return cls
    return decorator


@lazy_register_class("sgl.distributed.PushPlane", lambda: None)
class PushPlane(tvm_ffi.Object):
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank

    def describe(self, module: Module) -> str:
        return "plane"
'''


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """tvm_ffi and the user module out of ``sys.modules`` for the test, put back as they were afterwards; the
    finders the test installs (``sandbox(table)`` installs a stand-in table) are removed."""
    saved = {k: v for k, v in sys.modules.items() if k == "tvm_ffi" or k.startswith(("tvm_ffi.", USER))}
    for key in saved:
        monkeypatch.delitem(sys.modules, key)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{USER}.py").write_text(USER_SOURCE)
    installed: list[standins.Installed] = []

    def install(table: dict[str, standins.StandIn]) -> standins.Installed:
        installed.append(standins.install(table))
        return installed[-1]

    try:
        yield install
    finally:
        for done in installed:
            done.uninstall()
        for key in [k for k in sys.modules if k == "tvm_ffi" or k.startswith(("tvm_ffi.", USER))]:
            del sys.modules[key]
        # monkeypatch then puts back the saved modules, sys.meta_path and sys.path.


def test_stand_in_lets_a_class_subclass_object_at_import_and_raises_on_use(sandbox):
    forced = {"tvm_ffi": dataclasses.replace(standins.STANDINS["tvm_ffi"], prefer_real=False)}
    installed = sandbox(forced)  # a stand-in even where the real package is installed
    assert installed.stand_ins == ("tvm_ffi",) and installed.real == ()
    user = importlib.import_module(USER)
    tvm_ffi = sys.modules["tvm_ffi"]
    assert standins.is_standin(tvm_ffi) and standins.is_standin(user.PushPlane)
    assert installed.used() == ["tvm_ffi"]
    with pytest.raises(standins.StandInUsed, match=r"'tvm_ffi\.Object' was used \(instantiating PushPlane\)") as use:
        user.PushPlane(0, 1)
    assert "all_reduce.py" in str(use.value) and "test_standins_tvm_ffi.py" in str(use.value)
    with pytest.raises(standins.StandInUsed, match=r"'tvm_ffi' was used \(reading tvm_ffi\.Object\)"):
        tvm_ffi.Object()  # the class statement's own read is allowed only while importing
    with pytest.raises(standins.StandInUsed, match=r"reading tvm_ffi\.register_object"):
        tvm_ffi.register_object("sgl.NgramCorpus")
    with pytest.raises(standins.StandInUsed, match=r"reading PushPlane\.rank"):
        user.PushPlane.rank  # noqa: B018 - an attribute the C++ side would give
    with pytest.raises(standins.StandInUsed, match=r"'tvm_ffi\.Module' was used \(calling it\)"):
        user.Module("lib.so")  # a name taken at import
    with pytest.raises(standins.StandInUsed, match=r"'tvm_ffi\.Module' was used \(subclassing it\)"):
        types.new_class("Late", (user.Module,))  # after import, subclassing is a use too
    assert user.PushPlane.describe(None, None) == "plane"  # its own class body is real


def test_stand_in_serves_when_the_real_package_does_not_import(sandbox):
    class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """tvm_ffi is found but fails to import, as where its shared library cannot load."""

        def find_spec(self, fullname, path, target=None):
            return importlib.machinery.ModuleSpec(fullname, self) if fullname == "tvm_ffi" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise ImportError("libtvm_ffi.so: cannot open shared object file")

    sys.meta_path.insert(0, Broken())
    assert standins.STANDINS["tvm_ffi"].prefer_real
    installed = sandbox({"tvm_ffi": standins.STANDINS["tvm_ffi"]})
    assert installed.stand_ins == ("tvm_ffi",) and installed.real == ()
    assert "tvm_ffi" not in sys.modules  # the failed real import left nothing behind
    user = importlib.import_module(USER)
    assert standins.is_standin(sys.modules["tvm_ffi"]) and standins.is_standin(user.PushPlane)


@pytest.mark.skipif(importlib.util.find_spec("tvm_ffi") is None, reason="apache-tvm-ffi is not installed here")
def test_the_real_package_is_used_when_it_imports(tmp_path):
    # In a fresh interpreter: the real tvm_ffi loads a shared library and stays loaded.
    code = (
        "import json, sys\n"
        "from kvparity.engine.real import standins\n"
        "i = standins.install({'tvm_ffi': standins.STANDINS['tvm_ffi']})\n"
        f"import {USER}\n"
        "import tvm_ffi\n"
        "print(json.dumps({'real': i.real, 'stand_ins': i.stand_ins, 'used': i.used(),\n"
        f"    'standin': standins.is_standin(tvm_ffi) or standins.is_standin({USER}.PushPlane),\n"
        f"    'subclass': issubclass({USER}.PushPlane, tvm_ffi.Object)}}))\n"
    )
    (tmp_path / f"{USER}.py").write_text(USER_SOURCE)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), str(tmp_path)))))
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.splitlines()[-1])
    assert info == {"real": ["tvm_ffi"], "stand_ins": [], "used": [], "standin": False, "subclass": True}

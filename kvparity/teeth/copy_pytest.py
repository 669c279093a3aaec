"""pytest run in a mutated copy of the repository, as a finished process (``CompletedProcess``).

On the CPU the run is forked from kvparity's fork server (``kvparity.engine.processes``), which
has torch, Triton and Hypothesis imported already: a fresh interpreter spends about three seconds
importing them, against a fraction of a second for most mutants' kill. The forked process forgets
every kvparity module the server had imported and puts the copy first on ``sys.path``, so it runs
the copy's code and nothing of the repository's. On a GPU run (no fork server) it is a fresh
``python -m pytest`` in the copy, as it always was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# What a forked run forgets: the repository's own modules (the copy has its own of each).
OWN_MODULES = ("kvparity", "tests", "conftest")
INTERNAL_ERROR = 3  # pytest's own exit code for "pytest itself failed"


def run_pytest(argv: list[str], root: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m pytest ARGV`` in ``root`` with exactly ``env``; raises ``TimeoutExpired`` past
    ``timeout`` seconds, as ``subprocess.run`` does."""
    from kvparity.engine import processes

    command = [sys.executable, "-m", "pytest", *argv]
    if not processes.cpu_run():
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    out, err = root / ".pytest-stdout", root / ".pytest-stderr"
    child = processes.context().Process(target=_forked_pytest, args=(argv, str(root), env, str(out), str(err)))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise subprocess.TimeoutExpired(command, timeout)
    finished = root / ".pytest-exit"
    if not finished.exists():  # it died before pytest returned: never read that as a kill
        return subprocess.CompletedProcess(command, INTERNAL_ERROR, _read(out), _read(err) + (
            f"\nkvparity: the forked pytest process ended (exit code {child.exitcode}) before pytest returned"))
    return subprocess.CompletedProcess(command, int(finished.read_text()), _read(out), _read(err))


def _forked_pytest(argv: list[str], root: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: forget the repository's modules, take the copy's, run pytest."""
    for name in [m for m in sys.modules if m.split(".")[0] in OWN_MODULES]:
        del sys.modules[name]
    sys.path.insert(0, root)
    os.chdir(root)
    # Triton was imported in the fork server, in the mode its TRITON_INTERPRET then said; the
    # copy's kernels check that mode against the device they choose, so it stays what it was.
    mode = os.environ.get("TRITON_INTERPRET")
    os.environ.clear()
    os.environ.update(env)
    if mode is not None and "triton" in sys.modules:
        os.environ["TRITON_INTERPRET"] = mode
    for fd, path in ((1, out), (2, err)):
        with open(path, "w") as file:
            os.dup2(file.fileno(), fd)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    import pytest

    code = int(pytest.main(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    Path(root, ".pytest-exit").write_text(str(code))
    os._exit(code)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""

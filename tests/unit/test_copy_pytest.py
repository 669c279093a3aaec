"""pytest in a mutated copy (kvparity.teeth.copy_pytest): the copy's code runs, never the
repository's, and a run that dies before pytest returns is never read as a failing test (which
the zoo would count as a kill)."""

import os

import pytest

from kvparity.engine.processes import cpu_run
from kvparity.teeth.copy_pytest import INTERNAL_ERROR, run_pytest


def _copy(tmp_path, test_body: str):
    (tmp_path / "kvparity").mkdir()
    (tmp_path / "kvparity" / "__init__.py").write_text("WHICH = 'the copy'\n")
    (tmp_path / "test_which.py").write_text(f"import os\n\nimport kvparity\n\n\ndef test_which():\n    {test_body}\n")
    return tmp_path


@pytest.mark.parametrize(("body", "code"), [("assert kvparity.WHICH == 'the copy'", 0),
                                            ("assert kvparity.WHICH == 'the repository'", 1)])
def test_the_copy_runs_its_own_package(tmp_path, body, code):
    done = run_pytest(["-q", "-p", "no:cacheprovider", "test_which.py"], _copy(tmp_path, body), dict(os.environ), 60)
    assert done.returncode == code, done.stdout + done.stderr


@pytest.mark.skipif(not cpu_run(), reason="a GPU run starts pytest afresh: its exit code is the process's")
def test_a_run_that_dies_before_pytest_returns_is_an_internal_error(tmp_path):
    done = run_pytest(["-q", "-p", "no:cacheprovider", "test_which.py"], _copy(tmp_path, "os._exit(1)"),
                      dict(os.environ), 60)
    assert done.returncode == INTERNAL_ERROR and "before pytest returned" in done.stderr

"""SGLang checkouts: PEP 440 versions (kvparity/engine/real/versions.py), a checkout's version from
git (install.git_version), and the adapter entry chosen by probing the folder's code (probe.py,
install.resolve).

The checkout-shaped folders are built at test time from releases installed in
``install.cache_root()`` (``python -m kvparity.engine.real.install 0.5.21`` installs one); a test
whose release is not there skips, saying so. A copy's folders are real and its files are symlinks
into the cache: ``_edit`` replaces a symlink with a file of its own, so the cache is never written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity.engine.errors import RealSGLangError
from kvparity.engine.real import install, probe, versions
from kvparity.engine.release_order import parse_version, version_key

from checkout_cases import _checkout, _edit, _release

# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    "text, normalized",
    [("0.5.22.dev12+g1a2b3c4", "0.5.22.dev12+g1a2b3c4"), ("0.5.3rc1", "0.5.3rc1"), ("0.5.3.post1", "0.5.3.post1"),
     ("sglang==0.5.4", "0.5.4"), ("v0.5.4", "0.5.4"), ("0.5.3-post1", "0.5.3.post1"),
     (" sglang==0.5.3.post1 ", "0.5.3.post1")],
)
def test_parse_version_accepts_pep440_and_normalizes_it(text, normalized):
    assert parse_version(text) == normalized


@pytest.mark.parametrize("text", ["banana", "0.5", "sglang>=0.5.3", ""])
def test_parse_version_refuses_what_is_not_an_sglang_version(text):
    with pytest.raises(RealSGLangError, match="is not an SGLang version"):
        parse_version(text)


def test_version_key_orders_dev_rc_final_local_post():
    shuffled = ["0.5.3.post1", "0.5.3+g1a2b3c4", "0.5.3", "0.5.3.dev2", "0.5.3rc1"]
    assert sorted(shuffled, key=version_key) == [
        "0.5.3.dev2", "0.5.3rc1", "0.5.3", "0.5.3+g1a2b3c4", "0.5.3.post1"]


def test_a_dev_version_is_below_the_release_it_leads_to():
    releases = ["0.5.3", "0.5.21", "0.5.22", "0.5.23"]
    assert versions.latest_release_at_or_below("0.5.22.dev12+gabc", releases) == "0.5.21"
    assert versions.latest_release_at_or_below("0.5.22+gabc", releases) == "0.5.22"
    assert versions.latest_release_at_or_below("0.5.2", releases) is None


# --------------------------------------------------------------------------- git


@pytest.fixture
def no_git_above(tmp_path, monkeypatch):
    """Git never looks above tmp_path, so a folder there is in a repository only if a test made one."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        check=True, capture_output=True, text=True,
    )
    return done.stdout.strip()


def _repo(repo: Path, tag: str, after: int) -> str:
    """A git repository at ``repo``: one commit tagged ``tag``, then ``after`` more; HEAD's short sha."""
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "release")
    _git(repo, "tag", tag)
    for i in range(after):
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"change {i}")
    return _git(repo, "rev-parse", "--short", "HEAD")


def test_git_version_after_a_tag_is_the_next_release_dev(tmp_path, no_git_above):
    sha = _repo(tmp_path / "repo", "v0.5.21", after=3)
    assert install.git_version(tmp_path / "repo") == f"0.5.22.dev3+g{sha}"


def test_git_version_on_a_tag_is_the_release(tmp_path, no_git_above):
    _repo(tmp_path / "repo", "v0.5.21", after=0)
    assert install.git_version(tmp_path / "repo") == "0.5.21"


def test_git_version_without_git_is_none(tmp_path, no_git_above):
    assert install.git_version(tmp_path) is None


# --------------------------------------------------------------------------- checkouts


# The 0.5.23 code fits the entries of 0.5.22 and 0.5.23; the version chooses among them the newest
# not after it (a .devN is before its release).
@pytest.mark.parametrize("version, entry", [("0.5.24.dev3+g1a2b3c4", "0.5.23"), ("0.5.23.dev3+g1a2b3c4", "0.5.22")])
def test_a_checkouts_version_file_names_it_and_chooses_among_the_entries_its_code_fits(
        version, entry, tmp_path, no_git_above):
    python = _checkout("0.5.23", tmp_path / "sglang-checkout")
    _edit(python / "sglang" / "_version.py", "= '0.5.23'", f"= '{version}'")
    src = install.resolve(str(python))
    assert (src.version, src.version_from, src.origin, src.path) == (version, "file", "path", str(python.resolve()))
    assert src.entry_release == entry


def test_an_unversioned_checkout_is_driven_by_the_newest_entry_its_code_fits(tmp_path, no_git_above):
    python = _checkout("0.5.21", tmp_path / "sglang-checkout")
    (python / "sglang" / "_version.py").unlink()  # never built: version.py alone holds no version
    src = install.resolve(str(python))
    assert (src.version, src.version_from, src.entry_release) == ("unversioned", "none", "0.5.21")


def test_a_git_checkout_without_a_version_file_is_named_by_git(tmp_path, no_git_above):
    python = _checkout("0.5.21", tmp_path / "sglang-checkout")
    (python / "sglang" / "_version.py").unlink()
    sha = _repo(tmp_path / "sglang-checkout", "v0.5.21", after=2)
    src = install.resolve(str(python))
    assert (src.version, src.version_from, src.entry_release) == (f"0.5.22.dev2+g{sha}", "git", "0.5.21")


RENAMED = {  # release -> (its file, the function renamed there, the fact that fails, the nearest generation)
    "0.5.21": ("srt/mem_cache/allocation.py", "write_cache_indices", "sglang.srt.mem_cache.allocation:write_cache_indices",
               "prefix_indices"),
    "0.5.22": ("srt/mem_cache/common.py", "checkpoint_kv_cache", "sglang.srt.mem_cache.common:checkpoint_kv_cache",
               "prefix_len"),
}


def _renamed_checkout(release: str, root: Path) -> tuple[Path, str, str]:
    """A checkout of ``release`` with one function renamed: its folder, the failed fact, the generation."""
    file, name, qualified, generation = RENAMED[release]
    python = _checkout(release, root)
    _edit(python / "sglang" / file, f"def {name}(", f"def {name}_renamed(")
    return python, qualified, generation


@pytest.mark.parametrize("release", sorted(RENAMED))
def test_code_no_entry_fits_is_refused_naming_the_nearest_generation_and_what_failed(release, tmp_path, no_git_above):
    python, qualified, generation = _renamed_checkout(release, tmp_path / "sglang-checkout")
    with pytest.raises(RealSGLangError) as refused:
        install.resolve(str(python))
    message = str(refused.value)
    assert f"(version {release}) matches no SGLang generation kvparity drives" in message
    assert re.search(rf"the nearest is the '{generation}' generation \(.*\), as in {re.escape(release)}, "
                     rf"where {re.escape(qualified)} is missing$", message), message


def test_the_cli_refuses_such_a_checkout_with_exit_2_and_one_sentence(tmp_path, no_git_above):
    python, qualified, _ = _renamed_checkout("0.5.21", tmp_path / "sglang-checkout")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kvparity")), "check", "--sglang", str(python), "--against", "0.5.21"],
        capture_output=True, text=True, timeout=120,  # refused while resolving: no worker starts
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("kvparity check: the sglang package in ")
    assert f"where {qualified} is missing" in done.stderr


# --------------------------------------------------------------------------- every installed release


# The releases the setup installs (scripts/setup_env.sh); every other release's code was probed to
# its own entry when the table was written (docs/real-sglang.md), at about a second each.
SET_UP = ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.4", "0.5.21", "0.5.22", "0.5.23")


@pytest.mark.parametrize("release", SET_UP)
def test_every_set_up_release_is_probed_to_its_own_entry(release):
    assert probe.choose_entry(_release(release), release).entry.version == release


def test_a_feature_the_driving_code_needs_is_an_entry_fact_the_probe_checks():
    """0.5.20 and 0.5.21 keep a request's lock receipt, which the adapter sets (``lock_receipt``), and
    0.5.22 has none: 0.5.21's entry is refused for 0.5.22's code on that fact, not found out when a
    world runs."""
    receipt = "sglang.srt.managers.schedule_batch:Req.lock_receipt"
    assert (versions.SUPPORTED["0.5.21"].lock_receipt, versions.SUPPORTED["0.5.22"].lock_receipt) == (True, False)
    assert f"{receipt} is missing" in probe.SourceApi(_release("0.5.22")).problems(
        probe.entry_facts(versions.SUPPORTED["0.5.21"]))

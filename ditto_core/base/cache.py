"""Content-addressed cache of pipeline stage outputs (docs/BUILD.md, "Cache").

Layout: ``<root>/<stage>/<key>/`` holding the stage's files and ``meta.json``. ``<root>`` is
``$DITTO_CACHE_DIR`` or ``~/.cache/ditto``; ``DITTO_NO_CACHE=1`` disables the cache. The key is
the SHA-256 of a canonical JSON of everything that determines the output (input file hashes,
options, tool and plugin versions), so an entry never needs invalidating: changed inputs give a
new key. Entries are created atomically (built in a temp dir beside the final one, then
renamed), so a crashed build never leaves a half entry that a later build would reuse.

Entries are never handed out by hard link: a build directory gets its own copy of each file,
so editing or overwriting a file there cannot change the cache. ``meta.json`` records each
file's size and SHA-256 at store time; ``fetch`` checks them while copying, and an entry whose
files no longer match (edited, truncated, replaced) is a miss: a one-line warning on stderr,
the entry is removed, and the build recomputes and stores it again. A cache directory that
cannot be used (not a directory, not writable) disables the cache with one warning; the
build still runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from .signals import pid_tag, sweep_stale

_HASH_MEMO: dict[tuple[str, int, int], str] = {}
_CHUNK = 1 << 22
#: Key of ``meta.json`` holding ``{file name: {"size": bytes, "sha256": hex}}``.
FILES_KEY = "files"
_WARNED: set[str] = set()


def warn(message: str) -> None:
    """Print ``warning: <message>`` on stderr, once per distinct message per process."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def default_root() -> Path:
    """``$DITTO_CACHE_DIR`` or ``~/.cache/ditto``."""
    env = os.environ.get("DITTO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ditto"


def file_hash(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes (memoised per path, size and mtime, so hashing
    a large checkpoint twice in one process costs nothing). Raises OSError if unreadable."""
    path = Path(path)
    st = path.stat()
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key in _HASH_MEMO:
        return _HASH_MEMO[memo_key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    _HASH_MEMO[memo_key] = h.hexdigest()
    return _HASH_MEMO[memo_key]


def remember_hash(path: Path, digest: str) -> None:
    """Record that ``path``, as it is now (size, mtime), has SHA-256 ``digest``, so
    ``file_hash`` returns it without reading the file (for a caller that has just hashed the
    same bytes, e.g. a bundled model verified while it was assembled)."""
    path = Path(path)
    st = path.stat()
    _HASH_MEMO[(str(path.resolve()), st.st_size, st.st_mtime_ns)] = digest


def tree_hash(paths) -> str:
    """SHA-256 over (file name, file hash) of several files, order-independent."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode() + b"\0" + file_hash(p).encode() + b"\n")
    return h.hexdigest()


def make_key(parts: Mapping) -> str:
    """Cache key: SHA-256 of the canonical JSON of ``parts`` (str() for non-JSON values)."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _sha256(path: Path) -> str:
    """SHA-256 hex of a file's bytes now (no memo: used to verify cache entries)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_hashed(src: Path, dst: Path) -> tuple[int, str]:
    """Copy ``src`` to a new file ``dst`` (a private inode, never a hard link) and return
    (bytes copied, SHA-256 hex of those bytes), computed in the same single read pass.
    Copies the permission bits. Raises OSError; a partial ``dst`` is removed then."""
    src, dst = Path(src), Path(dst)
    h = hashlib.sha256()
    n = 0
    try:
        with open(src, "rb") as fi, open(dst, "xb") as fo:
            for chunk in iter(lambda: fi.read(_CHUNK), b""):
                h.update(chunk)
                fo.write(chunk)
                n += len(chunk)
        shutil.copymode(src, dst)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    return n, h.hexdigest()


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class Cache:
    """A stage-output cache rooted at ``root`` (default ``default_root()``); ``enabled=False``
    (or ``DITTO_NO_CACHE=1``) makes every lookup miss and every store a no-op. A root that
    cannot be created or written disables the cache with the warning
    ``cache disabled: <root>: <reason>`` (once per process)."""

    def __init__(self, root: Path | None = None, enabled: bool | None = None):
        self.root = Path(root) if root is not None else default_root()
        if enabled is None:
            enabled = os.environ.get("DITTO_NO_CACHE", "") not in ("1", "true", "yes")
        self.enabled = enabled
        if self.enabled:
            self._check_root()

    def _disable(self, reason: str) -> None:
        self.enabled = False
        warn(f"cache disabled: {self.root}: {reason}")

    def _check_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            self._disable("exists and is not a directory")
            return
        except OSError as exc:
            self._disable(_reason(exc))
            return
        if not self.root.is_dir():
            self._disable("not a directory")
        elif not os.access(self.root, os.W_OK | os.X_OK):
            self._disable("not writable")

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def _read_meta(self, d: Path) -> dict | None:
        """The entry's meta dict; None when there is no entry; {} when the entry directory
        exists but its meta.json is missing, unreadable or not a JSON object (a corrupt entry:
        the callers remove it, so it is rebuilt instead of being a miss forever)."""
        try:
            meta = json.loads((d / "meta.json").read_text())
        except FileNotFoundError:
            return {} if d.is_dir() else None
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def _discard(self, d: Path, why: str) -> None:
        """Warn that entry ``d`` is bad and remove it (renamed aside first, so a concurrent
        reader never sees it half-deleted)."""
        warn(f"cache entry {d}: {why}; rebuilding it")
        aside = d.parent / f".bad-{pid_tag()}{d.name}"
        try:
            os.rename(d, aside)
        except OSError:
            return
        shutil.rmtree(aside, ignore_errors=True)

    @staticmethod
    def _check(d: Path, meta: dict, names) -> str | None:
        """Why entry ``d`` cannot serve ``names`` from its recorded sizes alone, or None."""
        files = meta.get(FILES_KEY)
        if not isinstance(files, dict):
            return "no checksums recorded (written by an older Ditto)"
        for name in names:
            rec = files.get(name)
            if not isinstance(rec, dict) or "sha256" not in rec or "size" not in rec:
                return f"{name}: no checksum recorded"
            try:
                size = (d / name).stat().st_size
            except OSError as exc:
                return f"{name}: {_reason(exc)}"
            if size != rec["size"]:
                return f"{name}: {size} bytes, {rec['size']} recorded (modified or truncated)"
        return None

    def get(self, stage: str, key: str) -> tuple[Path, dict] | None:
        """(entry directory, its meta dict) if ``stage``/``key`` is cached and every file
        recorded in it still has its recorded size and SHA-256, else None (a bad entry is
        removed, with a warning). Use ``fetch`` to copy files out: it checks while copying."""
        if not self.enabled:
            return None
        d = self.entry(stage, key)
        meta = self._read_meta(d)
        if meta is None:
            return None
        files = meta.get(FILES_KEY) if meta else None
        why = self._check(d, meta, list(files) if isinstance(files, dict) else [])
        if why is None:
            for name, rec in files.items():
                try:
                    digest = _sha256(d / name)
                except OSError as exc:
                    why = f"{name}: {_reason(exc)}"
                    break
                if digest != rec["sha256"]:
                    why = f"{name}: SHA-256 differs from the recorded one (modified)"
                    break
        if why is not None:
            self._discard(d, why if meta else "meta.json missing or unreadable")
            return None
        return d, meta

    def fetch(self, stage: str, key: str, dests: Mapping[str, Path],
              validate: Callable[[dict], str | None] | None = None) -> dict | None:
        """Copy the files of entry ``stage``/``key`` to ``dests`` (name in the entry → path)
        and return the entry's meta dict; None on a miss. Each file is copied to a private
        inode (never a hard link) under a temp name beside its destination, hashed in the same
        pass and renamed into place only when every file's size and SHA-256 match ``meta.json``.
        A mismatching or truncated entry, or one whose meta dict ``validate(meta)`` finds a
        problem with (it returns the reason, or None when the stage can use it), is removed
        with a one-line warning and is a miss; nothing is left at ``dests`` then."""
        if not self.enabled:
            return None
        d = self.entry(stage, key)
        meta = self._read_meta(d)
        if meta is None:
            return None
        if not meta:
            self._discard(d, "meta.json missing or unreadable")
            return None
        why = self._check(d, meta, dests)
        if why is None and validate is not None:
            why = validate(meta)
        tmps: dict[Path, Path] = {}
        try:
            if why is None:
                for name, dst in dests.items():
                    dst = Path(dst)
                    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
                    tmp.unlink(missing_ok=True)
                    tmps[tmp] = dst
                    size, digest = copy_hashed(d / name, tmp)
                    rec = meta[FILES_KEY][name]
                    if size != rec["size"] or digest != rec["sha256"]:
                        why = f"{name}: SHA-256 differs from the recorded one (modified)"
                        break
            if why is not None:
                for tmp in tmps:
                    tmp.unlink(missing_ok=True)
                self._discard(d, why)
                return None
            for tmp, dst in tmps.items():
                os.replace(tmp, dst)
        except OSError as exc:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            warn(f"cache entry {d}: cannot copy it out ({_reason(exc)}); rebuilding")
            return None
        except BaseException:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise
        return meta

    def put(self, stage: str, key: str, files: Mapping[str, Path], meta: Mapping) -> Path | None:
        """Store private copies of ``files`` (name in the entry → source path) and ``meta``
        (plus each file's size and SHA-256 under ``"files"``) under ``stage``/``key``
        atomically; returns the entry directory (None when disabled or when the store failed,
        which warns once and disables the cache). A concurrent writer of the same key wins
        harmlessly (same content); an existing entry that fails verification is replaced."""
        if not self.enabled:
            return None
        final = self.entry(stage, key)
        if final.exists() and self.get(stage, key) is not None:
            return final  # (get() removed a corrupt entry, so the rename below can succeed)
        tmp = None
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            for prefix in (".tmp-", ".bad-"):  # left by killed builds
                sweep_stale(final.parent, prefix)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{pid_tag()}{key[:16]}-",
                                        dir=final.parent))
            recorded = {}
            for name, src in files.items():
                size, digest = copy_hashed(src, tmp / name)
                recorded[name] = {"size": size, "sha256": digest}
            (tmp / "meta.json").write_text(
                json.dumps({**dict(meta), FILES_KEY: recorded}, indent=2, default=str))
            try:
                os.rename(tmp, final)
            except OSError:  # someone else stored it first
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as exc:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._disable(f"cannot store an entry: {_reason(exc)}")
            return None
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

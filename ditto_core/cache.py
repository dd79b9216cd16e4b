"""Content-addressed cache of pipeline stage outputs (docs/BUILD.md, "Cache").

Layout: ``<root>/<stage>/<key>/`` holding the stage's files and ``meta.json``. ``<root>`` is
``$DITTO_CACHE_DIR`` or ``~/.cache/ditto``; ``DITTO_NO_CACHE=1`` disables the cache. The key is
the SHA-256 of a canonical JSON of everything that determines the output (input file hashes,
options, tool and plugin versions), so an entry never needs invalidating: changed inputs give a
new key. Entries are created atomically (built in a temp dir beside the final one, then
renamed), so a crashed build never leaves a half entry that a later build would reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

_HASH_MEMO: dict[tuple[str, int, int], str] = {}


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
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    _HASH_MEMO[memo_key] = h.hexdigest()
    return _HASH_MEMO[memo_key]


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


def materialize(src: Path, dst: Path) -> None:
    """Make ``dst`` a copy of the cached file ``src``: a hard link when both are on one file
    system (instant; safe because Ditto replaces files atomically, never edits them in place),
    else a byte copy. ``dst`` appears atomically (temp name + rename)."""
    src, dst = Path(src), Path(dst)
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


class Cache:
    """A stage-output cache rooted at ``root`` (default ``default_root()``); ``enabled=False``
    (or ``DITTO_NO_CACHE=1``) makes every lookup miss and every store a no-op."""

    def __init__(self, root: Path | None = None, enabled: bool | None = None):
        self.root = Path(root) if root is not None else default_root()
        if enabled is None:
            enabled = os.environ.get("DITTO_NO_CACHE", "") not in ("1", "true", "yes")
        self.enabled = enabled

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def get(self, stage: str, key: str) -> tuple[Path, dict] | None:
        """(entry directory, its meta dict) if ``stage``/``key`` is cached, else None."""
        if not self.enabled:
            return None
        d = self.entry(stage, key)
        meta = d / "meta.json"
        if not meta.is_file():
            return None
        try:
            return d, json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def put(self, stage: str, key: str, files: Mapping[str, Path], meta: Mapping) -> Path | None:
        """Store copies of ``files`` (name in the entry → source path) and ``meta`` under
        ``stage``/``key`` atomically; returns the entry directory (None when disabled). A
        concurrent writer of the same key wins harmlessly (same content)."""
        if not self.enabled:
            return None
        final = self.entry(stage, key)
        if (final / "meta.json").is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.tmp-", dir=final.parent))
        try:
            for name, src in files.items():
                try:  # the stage output is fresh and never edited in place: share it
                    os.link(src, tmp / name)
                except OSError:
                    shutil.copy2(src, tmp / name)
            (tmp / "meta.json").write_text(json.dumps(dict(meta), indent=2, default=str))
            try:
                os.rename(tmp, final)
            except OSError:  # someone else stored it first
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

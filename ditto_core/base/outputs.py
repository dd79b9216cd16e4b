"""Where a command may write an output file, checked before any work (docs/RELIABILITY.md).

The rule every writing command follows (``ditto export -o``, ``ditto cc -o/--report/--emit-ir``,
the files of ``ditto build -o``): an output path that is one of the command's inputs, or is not
a regular file (a directory, FIFO, device node, socket), is refused; a symbolic link is
written *through* (its target is replaced atomically, the link stays), never replaced. Inputs
are compared by identity (``os.path.samefile``: same device and inode), so a hard link or a
symlink to an input is caught as well as the same path spelled differently.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

from .errors import DittoError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """A file type in words ("a FIFO", "a directory", ...) from an ``st_mode``."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def output_target(path: os.PathLike | str, what: str = "output",
                  inputs: Iterable[os.PathLike | str] = ()) -> Path:
    """The path to write for output ``path`` (``what`` names it in messages, e.g. "model
    file"): ``path`` itself, or the file a symlink points to (written through). ``inputs``:
    the files the command reads.

    Raises DittoError ``<path>: ...`` when ``path`` (or its symlink target) is a directory or
    another non-regular file, is a dangling symlink whose directory is missing, or is one of
    ``inputs``. Creates and changes nothing."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # the writer reports a missing parent
        st = None
    except OSError as exc:
        raise DittoError(f"{path}: cannot check the {what} path: {exc.strerror or exc}") \
            from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        via = f" (the symlink points to {target})" if target != path else ""
        raise DittoError(f"{path}: is {file_kind(st.st_mode)}{via}; the {what} must be a "
                         "regular file, refusing to replace it")
    if st is None and target != path and not target.parent.is_dir():
        raise DittoError(f"{path}: is a symlink to {target}, whose directory does not exist")
    if st is not None:
        for inp in inputs:
            try:
                same = os.path.samefile(target, inp)
            except OSError:
                continue
            if same:
                raise DittoError(f"{path}: the {what} would overwrite the input {inp}; "
                                 "choose another output path")
    return target


def input_files(model: os.PathLike | str) -> list[Path]:
    """The files a model input may be read from: the file itself, or every file under a
    directory (symlinks followed). Used to keep outputs from replacing inputs."""
    p = Path(model)
    if p.is_dir():
        return [f for f in p.rglob("*") if f.is_file()]
    return [p]

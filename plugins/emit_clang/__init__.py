"""Ditto default plugin emit_clang: the IR emitter ``clang`` (stage 4, emit IR).

Each C source is compiled with ``clang-22 -O1 -emit-llvm -S`` (plus the include dirs, defines
and flags given, and Ditto's floating-point policy below); several sources are merged into one
module with ``llvm-link-22`` (or llvmlite's ``Module.link_in`` when that tool is missing).

Floating-point policy (docs/BUILD.md, "Fast-math policy"): replacing a loop reduction by a BLAS
call reorders its additions, which is only licensed when the additions carry LLVM's ``reassoc``
flag. Ditto therefore compiles with ``FP_POLICY_FLAGS`` = ``-fassociative-math
-fno-signed-zeros -fno-trapping-math -freciprocal-math -ffp-contract=fast -fno-math-errno``,
which gives every ``fadd``/``fmul`` the flags ``reassoc nsz arcp contract`` but, unlike
``-ffast-math``, NOT ``nnan``/``ninf``: ``isinf``/``isnan`` tests and ``-INFINITY`` sentinels
(softmax, masking) keep their meaning. The GEMV→BLAS pass rewrites only reductions whose
``fadd`` carries ``reassoc`` (or that are ``llvm.fmuladd`` calls with it). Pass
``-fno-associative-math`` in ``flags`` to opt a program out; the pass then leaves its loops alone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from ditto_core.base.errors import DittoError
from ditto_core.base.types import IRModule
from ditto_core.kit.hookspecs import hookimpl

CLANG = "clang-22"
LLVM_LINK = "llvm-link-22"

#: Ditto's documented fast-math policy: reassociation yes, finite-math assumptions no.
FP_POLICY_FLAGS = ("-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
                   "-fno-trapping-math", "-freciprocal-math", "-ffp-contract=fast")

#: Base flags of the emit stage (the O3 optimisation happens in the link stage).
BASE_FLAGS = ("-O1", "-emit-llvm", "-S", "-fno-discard-value-names")


def find_tool(name: str) -> str | None:
    """Absolute path of an LLVM tool (``clang-22``, ``llvm-link-22``) or None: PATH first, then
    the unversioned name in ``/usr/lib/llvm-22/bin``."""
    found = shutil.which(name)
    if found:
        return found
    alt = Path("/usr/lib/llvm-22/bin") / name.removesuffix("-22")
    return str(alt) if alt.exists() else None


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise DittoError(f"{what}: cannot run {cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        raise DittoError(f"{what} failed (exit {proc.returncode}):\n  $ {' '.join(cmd)}\n"
                         f"{proc.stderr.strip()}")
    return proc


class ClangEmitter:
    """IR emitter ``clang``: C11 sources → one LLVM IR module at -O1 (see module docstring).

    ``emit`` raises DittoError naming the source and quoting clang's stderr when a source does
    not compile, or naming the tool when clang-22 is missing.
    """

    name = "clang"
    policy_flags = FP_POLICY_FLAGS

    def command(self, source: Path, out: Path, *, include_dirs: Sequence[Path] = (),
                defines: Sequence[str] = (), flags: Sequence[str] = ()) -> list[str]:
        """The clang-22 command line that compiles ``source`` to IR text at ``out``."""
        clang = find_tool(CLANG)
        if clang is None:
            raise DittoError(f"{CLANG} not found on PATH: apt-get install clang-22")
        cmd = [clang, *BASE_FLAGS, *self.policy_flags]
        cmd += [f"-I{d}" for d in include_dirs]
        cmd += [d if d.startswith("-D") else f"-D{d}" for d in defines]
        cmd += list(flags)
        cmd += [str(source), "-o", str(out)]
        return cmd

    def emit(self, sources: Sequence[Path], *, include_dirs: Sequence[Path] = (),
             defines: Sequence[str] = (), flags: Sequence[str] = (), workdir: Path) -> IRModule:
        """Compile ``sources`` (C files) to one ``IRModule`` (LLVM IR text, target triple of the
        host). ``defines``: ``NAME`` or ``NAME=VALUE`` (a leading ``-D`` is accepted);
        ``flags``: extra clang flags (e.g. ``-fopenmp``) placed after the policy flags, so they
        may override it. ``workdir`` receives the per-source ``.ll`` files.
        """
        sources = [Path(s) for s in sources]
        if not sources:
            raise DittoError("emit IR: no C sources given")
        for s in sources:
            if not s.is_file():
                raise DittoError(f"{s}: no such C source file")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        outs = []
        for k, src in enumerate(sources):
            out = workdir / f"{k:03d}_{src.stem}.ll"
            _run(self.command(src, out, include_dirs=include_dirs, defines=defines,
                              flags=flags), f"{src}: clang-22 -emit-llvm")
            outs.append(out)
        label = ",".join(str(s) for s in sources)
        if len(outs) == 1:
            return IRModule(outs[0].read_text(), source=label)
        return IRModule(link_ir_files(outs, workdir / "linked.ll"), source=label)


def link_ir_files(files: Sequence[Path], out: Path) -> str:
    """Merge LLVM IR files into one module (text): ``llvm-link-22 -S``, else llvmlite."""
    tool = find_tool(LLVM_LINK)
    if tool is not None:
        _run([tool, "-S", *map(str, files), "-o", str(out)], "llvm-link-22")
        return out.read_text()
    import llvmlite.binding as llvm

    llvm.initialize_native_target()  # llvmlite >= 0.50 initialises its core itself
    llvm.initialize_native_asmparser()
    mods = []
    for f in files:
        try:
            mods.append(llvm.parse_assembly(Path(f).read_text()))
        except RuntimeError as exc:
            raise DittoError(f"{f}: LLVM IR does not parse: {exc}") from None
    main = mods[0]
    for m in mods[1:]:
        try:
            main.link_in(m)
        except RuntimeError as exc:
            raise DittoError(f"linking IR modules {files}: {exc}") from None
    text = str(main)
    out.write_text(text)
    return text


@hookimpl
def register_emitters(register):
    register(ClangEmitter())

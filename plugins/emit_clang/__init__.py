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

import os
import shutil
import signal
import subprocess
import tempfile
import time
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


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _kill_and_reap(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and reap it with ``os.waitpid``, not ``Popen.wait``: an exception
    raised by a signal handler inside ``Popen.poll`` can leave the Popen's wait lock held, and
    ``wait`` would then block forever."""
    if proc.returncode is not None:  # already reaped: its pid may be another process's now
        return
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        _, status = os.waitpid(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    except ChildProcessError:  # reaped by poll() just before the interruption
        pass


def run_parallel(jobs: Sequence[tuple[list[str], str]], limit: int | None = None) -> None:
    """Run the commands of ``jobs`` (``(cmd, what)`` pairs) at most ``limit`` at a time (default:
    the CPUs this process may use), each with its stderr in a temp file (no pipe to drain).
    Raises DittoError as ``_run`` does for the first failing job in the order given, once
    every job has ended. If anything interrupts the wait (a stop signal's exception), the
    children still running are killed and reaped before it propagates: no clang outlives it."""
    limit = max(1, limit or _cpus())
    errs: list[tuple[str, list[str], int | None, str]] = [("", [], 0, "")] * len(jobs)
    running: dict[int, tuple[subprocess.Popen, object]] = {}
    nxt = 0
    try:
        while nxt < len(jobs) or running:
            while nxt < len(jobs) and len(running) < limit:
                cmd, what = jobs[nxt]
                err = tempfile.TemporaryFile()
                try:
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
                except OSError as exc:
                    err.close()
                    raise DittoError(f"{what}: cannot run {cmd[0]}: {exc}") from None
                running[nxt] = (proc, err)
                nxt += 1
            done = [i for i, (proc, _) in running.items() if proc.poll() is not None]
            if not done:
                time.sleep(0.01)
            for i in done:
                proc, err = running.pop(i)
                if proc.returncode != 0:
                    err.seek(0)
                    errs[i] = (jobs[i][1], jobs[i][0], proc.returncode,
                               err.read().decode(errors="replace").strip())
                err.close()
    finally:
        for proc, err in running.values():
            _kill_and_reap(proc)
            err.close()
    for what, cmd, rc, text in errs:
        if rc != 0:
            raise DittoError(f"{what} failed (exit {rc}):\n  $ {' '.join(cmd)}\n{text}")


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
        outs = [workdir / f"{k:03d}_{src.stem}.ll" for k, src in enumerate(sources)]
        # one clang per source, as many at once as there are CPUs: the sources are
        # independent, and the merge below takes them in the order given
        run_parallel([(self.command(src, out, include_dirs=include_dirs, defines=defines,
                                    flags=flags), f"{src}: clang-22 -emit-llvm")
                      for src, out in zip(sources, outs)])
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

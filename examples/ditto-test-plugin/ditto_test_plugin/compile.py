"""Compile-side example components: an IR emitter and a linker that run clang-22 directly,
and an IR pass that counts the loops of every function and changes nothing."""

import re
import subprocess
from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.base.options import option
from ditto_core.base.types import IRModule, PassReport

#: Reassociation without finite-math assumptions (what the gemv-blas pass needs, docs/BUILD.md).
FP_FLAGS = ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
            "-freciprocal-math", "-ffp-contract=fast", "-fno-math-errno"]


def _run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DittoError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()}")


class PlainClangEmitter:
    """IR emitter ``test-clang``: ``clang-22 -O1 -S -emit-llvm`` per source, then
    ``llvm-link-22 -S`` to one module."""

    name = "test-clang"

    def emit(self, sources, *, include_dirs=(), defines=(), flags=(), workdir):
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        outs = []
        for k, src in enumerate(sources):
            out = workdir / f"{k}.ll"
            _run(["clang-22", "-O1", "-S", "-emit-llvm", *FP_FLAGS,
                  *[f"-I{d}" for d in include_dirs], *[f"-D{d}" for d in defines], *flags,
                  str(src), "-o", str(out)], f"{src}: test-clang")
            outs.append(str(out))
        _run(["llvm-link-22", "-S", *outs, "-o", str(workdir / "all.ll")], "llvm-link-22")
        return IRModule((workdir / "all.ll").read_text(), source=",".join(map(str, sources)))


class CountLoopsPass:
    """IR pass ``count-loops``: one report entry per defined function with its number of
    loops (branches carrying ``!llvm.loop`` metadata: one per loop latch clang emits)."""

    name = "count-loops"

    @attrs.frozen
    class Options:
        with_loops_only: bool = option(True, "report only the functions that have loops")

    def __init__(self, options=None):
        self.options = options or self.Options()

    def with_options(self, options):
        return CountLoopsPass(options)

    def run(self, module, blas):
        cands = []
        for fn, body in re.findall(r"^define [^@]*@([-\w.$]+)\(.*?\n(.*?)^\}", module.text,
                                   re.S | re.M):
            loops = len(re.findall(r"^\s*br .*!llvm\.loop", body, re.M))
            if loops or not self.options.with_loops_only:
                cands.append({"function": fn, "loops": loops, "status": "counted",
                              "reason": ""})
        return module, PassReport(tuple(cands))


class ClangLinker:
    """Linker ``test-clang``: ``clang-22 -O2 -march=native`` straight from the IR text,
    with the BLAS target's link flags and OpenMP (rpath to clang's libomp)."""

    name = "test-clang"

    def link(self, module, blas, out, *, extra_flags=()):
        out = Path(out)
        ll = out.parent / f".{out.name}.ll"
        ll.write_text(module.text)
        omp = subprocess.run(["clang-22", "-print-file-name=libomp.so"], capture_output=True,
                             text=True).stdout.strip()
        try:
            _run(["clang-22", "-O2", "-march=native", "-Wno-override-module", str(ll), "-o",
                  str(out), "-fopenmp", f"-Wl,-rpath,{Path(omp).resolve().parent}",
                  *(blas.link_flags() if blas is not None else []), *extra_flags, "-lm"],
                 f"{out}: test-clang link")
        finally:
            ll.unlink(missing_ok=True)
        return out

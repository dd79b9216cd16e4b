"""Ditto default plugin link_llvm: the linker ``llvm`` (stage 6, link).

1. Parse the IR with llvmlite and verify it.
2. Strip clang's per-function ``"target-cpu"``/``"target-features"``/``"tune-cpu"`` attributes
   where they are clang's baseline (``x86-64`` + SSE2): they would override the host target
   machine and no AVX2/AVX-512 would be generated. Functions compiled with their own
   ``__attribute__((target(...)))`` carry a different CPU or extra features and keep theirs
   (multi-versioned kernels must not all become host code).
3. Optimise at O3 with llvmlite's new pass manager (``create_pass_builder(tm,
   create_pipeline_tuning_options(3))``, loop and SLP vectorisation enabled) for the host CPU
   (``llvm.get_host_cpu_name()`` / ``get_host_cpu_features()``).
4. Emit an object file and link it with the system C compiler (clang-22) + the BLAS target's
   link flags (with rpath) + ``-lm`` + ``-fopenmp`` (libomp, when the IR uses OpenMP), so the
   executable runs without environment variables. The executable appears at ``out`` atomically.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.base.options import option
from ditto_core.base.signals import pid_tag, sweep_stale
from ditto_core.base.types import IRModule
from ditto_core.kit.hookspecs import hookimpl

from .llvm_init import init_llvm

CC = "clang-22"

_ATTR_LINE = re.compile(r"^attributes (#\d+) = \{(.*)\}\s*$", re.M)
_STR_ATTR = re.compile(r'"(target-cpu|target-features|tune-cpu)"="([^"]*)"')


@lru_cache(maxsize=1)
def clang_baseline() -> tuple[str, frozenset[str]]:
    """(target-cpu, target-features set) that clang-22 stamps on a function compiled without
    ``-march`` or a target attribute (probed once by compiling an empty function)."""
    try:
        proc = subprocess.run([CC, "-O1", "-S", "-emit-llvm", "-x", "c", "-", "-o", "-"],
                              input="void ditto_probe(void) {}\n", capture_output=True,
                              text=True, timeout=60)
        attrs = dict(_STR_ATTR.findall(proc.stdout))
        if "target-cpu" in attrs:
            feats = frozenset(f for f in attrs.get("target-features", "").split(",") if f)
            return attrs["target-cpu"], feats
    except (OSError, subprocess.SubprocessError):
        pass
    return "x86-64", frozenset("+cmov,+cx8,+fxsr,+mmx,+sse,+sse2,+x87".split(","))


def strip_target_attributes(text: str) -> tuple[str, dict]:
    """Remove clang's baseline ``target-cpu``/``target-features``/``tune-cpu`` from every
    attribute group that carries the baseline, keep them on groups of functions with their
    own target attribute (another CPU, or features beyond the baseline).

    Returns (new IR text, {"stripped": [group ids], "kept": [group ids]}).
    """
    base_cpu, base_feats = clang_baseline()
    stripped, kept = [], []

    def fix(m: re.Match) -> str:
        group, body = m.group(1), m.group(2)
        attrs = dict(_STR_ATTR.findall(body))
        if "target-cpu" not in attrs and "target-features" not in attrs:
            return m.group(0)
        feats = frozenset(f for f in attrs.get("target-features", "").split(",") if f)
        if attrs.get("target-cpu", base_cpu) == base_cpu and feats <= base_feats:
            stripped.append(group)
            body = _STR_ATTR.sub("", body)
            body = re.sub(r"\s+", " ", body).strip()
            return f"attributes {group} = {{ {body} }}"
        kept.append(group)
        return m.group(0)

    return _ATTR_LINE.sub(fix, text), {"stripped": stripped, "kept": kept}


def uses_openmp(text: str) -> bool:
    """True if the IR calls the OpenMP runtime (``__kmpc_*`` or ``omp_*``)."""
    return re.search(r"@(__kmpc_\w+|omp_\w+)\(", text) is not None


@lru_cache(maxsize=1)
def libomp_dir() -> Path | None:
    """Directory of clang-22's libomp.so (for the rpath), or None."""
    try:
        out = subprocess.run([CC, "-print-file-name=libomp.so"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    p = Path(out)
    return p.resolve().parent if p.is_absolute() and p.exists() else None


@lru_cache(maxsize=1)
def known_cpus() -> frozenset[str]:
    """The CPU names clang-22 (so LLVM 22) knows for this machine's target
    (``--print-supported-cpus``); empty when clang-22 cannot tell."""
    try:
        proc = subprocess.run([CC, "--print-supported-cpus"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    text = proc.stdout + proc.stderr
    _, _, listing = text.partition("Available CPUs for this target:")
    return frozenset(line.strip() for line in listing.splitlines()
                     if line.startswith("\t") and line.strip())


class LlvmLinker:
    """Linker ``llvm``: O3 for the host CPU with llvmlite, then link with clang-22.

    ``cpu``/``features`` override the host CPU name and feature string (LLVM syntax,
    ``"+avx2,+fma"``); default: the machine running Ditto. ``opt_level``: the LLVM
    optimisation level (0..3) of the module pipeline and the code generator.
    """

    name = "llvm"

    @attrs.frozen
    class Options:
        """``-O llvm.KEY=VALUE``."""

        cpu: str | None = option(None, "CPU to optimise for (LLVM name, e.g. znver3); "
                                       "default: this machine's")
        features: str | None = option(None, "CPU features (LLVM syntax, e.g. +avx2,+fma); "
                                            "default: this machine's")
        opt_level: int = option(3, "LLVM optimisation level 0..3",
                                validator=[attrs.validators.ge(0), attrs.validators.le(3)])

    def __init__(self, cpu: str | None = None, features: str | None = None,
                 opt_level: int = 3):
        self._cpu, self._features, self.opt_level = cpu, features, opt_level

    def with_options(self, options: "LlvmLinker.Options") -> "LlvmLinker":
        """A copy of this linker configured with ``options``. Raises DittoError for a ``cpu``
        LLVM does not know (it would warn and optimise for a generic CPU)."""
        known = known_cpus() if options.cpu is not None else frozenset()
        if known and options.cpu not in known:
            raise DittoError(f"llvm.cpu: {options.cpu!r} is not a CPU that LLVM knows for this "
                             f"target (`{CC} --print-supported-cpus` lists them)")
        return LlvmLinker(cpu=options.cpu, features=options.features,
                          opt_level=options.opt_level)

    # -- target --------------------------------------------------------------------------
    def host(self) -> tuple[str, str]:
        """(CPU name, feature string) the code is optimised for."""
        import llvmlite.binding as llvm
        init_llvm()
        cpu = self._cpu if self._cpu is not None else llvm.get_host_cpu_name()
        feats = (self._features if self._features is not None
                 else llvm.get_host_cpu_features().flatten())
        return cpu, feats

    def target_machine(self, triple: str):
        import llvmlite.binding as llvm
        init_llvm()
        cpu, feats = self.host()
        target = llvm.Target.from_triple(triple or llvm.get_process_triple())
        return target.create_target_machine(cpu=cpu, features=feats, opt=self.opt_level,
                                            reloc="pic", codemodel="default")

    # -- stages --------------------------------------------------------------------------
    def optimize(self, module: IRModule):
        """Parse, verify, strip baseline target attributes and run the O3 pipeline.

        Returns (llvmlite ModuleRef, target machine). Raises DittoError when the IR does not
        parse or verify (naming the module's source)."""
        import llvmlite.binding as llvm
        init_llvm()
        text, _ = strip_target_attributes(module.text)
        try:
            mod = llvm.parse_assembly(text)
            mod.verify()
        except RuntimeError as exc:
            raise DittoError(f"{module.source or 'IR module'}: invalid LLVM IR: {exc}") from None
        if not mod.triple:
            mod.triple = llvm.get_process_triple()
        tm = self.target_machine(mod.triple)
        mod.data_layout = str(tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=self.opt_level)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = True
        pto.loop_interleaving = True
        pb = llvm.create_pass_builder(tm, pto)
        mpm = pb.getModulePassManager()
        mpm.run(mod, pb)
        return mod, tm

    def assembly(self, module: IRModule) -> str:
        """Host assembly of the optimised module (for inspection and tests)."""
        mod, tm = self.optimize(module)
        return tm.emit_assembly(mod)

    def link_command(self, obj: Path, out: Path, blas, openmp: bool,
                     extra_flags: Sequence[str] = ()) -> list[str]:
        """The clang-22 command line linking ``obj`` into the executable ``out``."""
        cmd = [CC, str(obj), "-o", str(out)]
        if openmp:
            cmd.append("-fopenmp")
            d = libomp_dir()
            if d is not None:
                cmd.append(f"-Wl,-rpath,{d}")
        if blas is not None:
            cmd += blas.link_flags()
        cmd += list(extra_flags)
        cmd += ["-lm", "-pthread"]
        return cmd

    def link(self, module: IRModule, blas, out: Path, *,
             extra_flags: Sequence[str] = ()) -> Path:
        """Optimise ``module`` for the host CPU at O3, emit an object and link the executable
        ``out`` (atomically: built under a temporary name in the same directory, then
        renamed). ``blas``: a BlasTarget or None (no BLAS library linked). Raises DittoError
        with the linker's stderr on failure; nothing is left at ``out`` then."""
        out = Path(out)
        mod, tm = self.optimize(module)
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(Path(tempfile.gettempdir()), "ditto-link-")  # left by killed links
        with tempfile.TemporaryDirectory(prefix=f"ditto-link-{pid_tag()}") as tmp:
            obj = Path(tmp) / "program.o"
            obj.write_bytes(tm.emit_object(mod))
            tmp_out = out.parent / f".{out.name}.tmp-{os.getpid()}"
            cmd = self.link_command(obj, tmp_out, blas, uses_openmp(module.text), extra_flags)
            try:
                try:
                    # a stop (KeyboardInterrupt, Terminated) kills the linker in subprocess.run
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                except OSError as exc:
                    raise DittoError(f"{out}: cannot run {CC}: {exc}") from None
                if proc.returncode != 0:
                    raise DittoError(f"{out}: linking failed (exit {proc.returncode}):\n  $ "
                                     f"{' '.join(cmd)}\n{proc.stderr.strip()}")
                os.replace(tmp_out, out)
            except BaseException:  # failed or stopped: no temp output left beside ``out``
                tmp_out.unlink(missing_ok=True)
                raise
        return out


@hookimpl
def register_linkers(register):
    register(LlvmLinker())

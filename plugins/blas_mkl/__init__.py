"""Ditto default plugin blas_mkl: the BLAS target ``mkl``.

``mkl`` links Intel oneMKL's single dynamic library ``mkl_rt`` from PyPI ``mkl``/``mkl-devel``
when installed in this Python environment (no prefix: ``cblas_sgemv``), rpath included so the
executable runs without LD_LIBRARY_PATH.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from ditto_core.base.errors import DittoError
from ditto_core.kit.hookspecs import hookimpl


def _mkl_dist() -> md.Distribution | None:
    for name in ("mkl-devel", "mkl"):
        try:
            return md.distribution(name)
        except md.PackageNotFoundError:
            continue
    return None


class MklTarget:
    """BLAS target ``mkl``: Intel oneMKL's ``mkl_rt`` from PyPI ``mkl``/``mkl-devel``.

    The wheels put the libraries in ``<prefix>/lib`` and (mkl-include, pulled in by mkl-devel)
    the headers in ``<prefix>/include``. ``available()`` is (False, "not installed: pip install
    mkl-devel") when absent; the flag methods then raise DittoError with that message.
    """

    name = "mkl"

    def __init__(self, prefix: Path | None = None):
        self._prefix = prefix

    def _where(self) -> tuple[Path, Path, str] | None:
        """(lib dir, include dir, library file name) or None."""
        if self._prefix is None and _mkl_dist() is None:
            return None
        prefixes = [self._prefix] if self._prefix else [Path(sys.prefix), Path(sys.base_prefix)]
        for p in prefixes:
            lib = Path(p) / "lib"
            libs = sorted(lib.glob("libmkl_rt.so*"))
            if libs:
                return lib, Path(p) / "include", libs[0].name
        return None

    def available(self) -> tuple[bool, str]:
        found = self._where()
        if found is None:
            return (False, "not installed: pip install mkl-devel")
        lib, inc, _ = found
        if not (inc / "mkl_cblas.h").exists():
            return (False, f"{inc}: mkl_cblas.h missing: pip install mkl-devel (brings mkl-include)")
        return (True, "")

    def _require(self) -> tuple[Path, Path, str]:
        ok, why = self.available()
        if not ok:
            raise DittoError(f"BLAS target 'mkl' is not available: {why}")
        return self._where()

    def symbol(self, routine: str) -> str:
        return routine

    def compile_flags(self) -> list[str]:
        _, inc, _ = self._require()
        return [f"-I{inc}"]

    def link_flags(self) -> list[str]:
        lib, _, fname = self._require()
        if fname == "libmkl_rt.so":
            return [f"-L{lib}", "-lmkl_rt", f"-Wl,-rpath,{lib}"]
        # the plain wheel ships only libmkl_rt.so.N: link the file itself
        return [str(lib / fname), f"-Wl,-rpath,{lib}"]

    def thread_control(self) -> dict:
        return {"set_num_threads": "MKL_Set_Num_Threads",
                "set_num_threads_local": "MKL_Set_Num_Threads_Local",
                "get_num_threads": "MKL_Get_Max_Threads"}


@hookimpl
def register_blas(register):
    register(MklTarget())

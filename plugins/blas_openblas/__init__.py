"""Ditto default plugin blas_openblas: the BLAS target ``openblas``.

``openblas`` links the OpenBLAS shipped by PyPI ``scipy-openblas32`` (a dependency of Ditto, so
it is always there); its symbols carry the prefix ``scipy_`` (``scipy_cblas_sgemv``). The option
``-O openblas.system=true`` (or ``OpenBlasTarget(system=True)``; the deprecated environment
variable ``DITTO_OPENBLAS=system`` still sets it) uses the distribution's ``libopenblas`` in
``/usr/lib/x86_64-linux-gnu`` instead, whose symbols have no prefix.

The target also says how to make BLAS single-threaded inside an OpenMP region
(``thread_control()``), which the GEMV→BLAS pass needs to avoid oversubscription.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.base.options import option
from ditto_core.kit.hookspecs import hookimpl

SYSTEM_LIB_DIR = Path("/usr/lib/x86_64-linux-gnu")
SYSTEM_INCLUDE_DIRS = (Path("/usr/include/x86_64-linux-gnu/openblas-pthread"),
                       Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/openblas"),
                       Path("/usr/include"))


def _rpath_link_flags(lib_dir: Path, lib: str) -> list[str]:
    """``-L<dir> -l<lib> -Wl,-rpath,<dir>``: link and find the library at run time without
    LD_LIBRARY_PATH."""
    return [f"-L{lib_dir}", f"-l{lib}", f"-Wl,-rpath,{lib_dir}"]


class OpenBlasTarget:
    """BLAS target ``openblas``: scipy-openblas32 by default, the system libopenblas with
    ``system=True`` (option ``openblas.system``).

    Symbols: ``symbol("cblas_sgemv")`` is ``"scipy_cblas_sgemv"`` (PyPI) or ``"cblas_sgemv"``
    (system). Raises DittoError from the flag methods when the library is missing.
    """

    name = "openblas"

    @attrs.frozen
    class Options:
        """``-O openblas.KEY=VALUE``."""

        system: bool = option(
            False, "link the distribution's libopenblas (apt-get install libopenblas-dev) "
            "instead of PyPI scipy-openblas32", env="DITTO_OPENBLAS",
            env_value=lambda text: text.strip().lower() == "system")

    def __init__(self, system: bool = False):
        self.system = bool(system)

    def with_options(self, options: "OpenBlasTarget.Options") -> "OpenBlasTarget":
        """A copy of this target configured with ``options``."""
        return OpenBlasTarget(system=options.system)

    # -- where the library is ------------------------------------------------------------
    def _pypi(self):
        try:
            import scipy_openblas32 as so
        except ImportError:
            return None
        return so

    def _system_lib(self) -> Path | None:
        for name in ("libopenblas.so", "libopenblas.so.0"):
            if (SYSTEM_LIB_DIR / name).exists():
                return SYSTEM_LIB_DIR / name
        return None

    def available(self) -> tuple[bool, str]:
        """(True, "") if the library this target would link is present, else how to get it."""
        if self.system:
            if self._system_lib() is None:
                return (False, f"system libopenblas not found in {SYSTEM_LIB_DIR}: "
                               "apt-get install libopenblas-dev (or drop -O openblas.system=true)")
            return (True, "")
        so = self._pypi()
        if so is None:
            return (False, "not installed: pip install scipy-openblas32")
        lib_dir = Path(so.get_lib_dir())
        if not any(lib_dir.glob(f"lib{so.get_library()}.*")):
            return (False, f"{lib_dir}: lib{so.get_library()} missing: "
                           "pip install --force-reinstall scipy-openblas32")
        return (True, "")

    def _require(self) -> None:
        ok, why = self.available()
        if not ok:
            raise DittoError(f"BLAS target {self.name!r} is not available: {why}")

    def prefix(self) -> str:
        """Symbol prefix of the library: ``"scipy_"`` (PyPI) or ``""`` (system)."""
        return "" if self.system else "scipy_"

    def symbol(self, routine: str) -> str:
        """Linker symbol of a CBLAS/OpenBLAS routine: "cblas_sgemv" → "scipy_cblas_sgemv"."""
        return self.prefix() + routine

    def include_dir(self) -> Path:
        self._require()
        if self.system:
            for d in SYSTEM_INCLUDE_DIRS:
                if (d / "cblas.h").exists():
                    return d
            raise DittoError("system libopenblas: cblas.h not found in "
                             + ", ".join(map(str, SYSTEM_INCLUDE_DIRS))
                             + ": apt-get install libopenblas-dev")
        return Path(self._pypi().get_include_dir())

    def compile_flags(self) -> list[str]:
        """``-I<dir of cblas.h>``. Raises DittoError when the library is not available."""
        return [f"-I{self.include_dir()}"]

    def link_flags(self) -> list[str]:
        """``-L<dir> -l<lib> -Wl,-rpath,<dir>``. Raises DittoError when not available."""
        self._require()
        if self.system:
            return _rpath_link_flags(SYSTEM_LIB_DIR, "openblas")
        so = self._pypi()
        return _rpath_link_flags(Path(so.get_lib_dir()), so.get_library())

    def library_file(self) -> Path:
        """The shared library this target links (raises DittoError when not available)."""
        self._require()
        if self.system:
            return self._system_lib()
        so = self._pypi()
        return sorted(Path(so.get_lib_dir()).glob(f"lib{so.get_library()}.so*"))[0]

    def exports(self, symbol: str) -> bool:
        """True if the library exports ``symbol`` (checked by loading it with ctypes)."""
        import ctypes
        try:
            return hasattr(ctypes.CDLL(str(self.library_file())), symbol)
        except OSError:
            return False

    def thread_control(self) -> dict:
        """Symbols that set BLAS's thread count from C (None when the library lacks one):
        ``set_num_threads`` ``void f(int)``, process-wide; ``set_num_threads_local``
        ``int f(int)``, calling thread only (OpenBLAS >= 0.3.27 with OpenMP threading; the
        pthreads build in scipy-openblas32 does not export it); ``get_num_threads`` ``int f()``.
        A BLAS call inside an OpenMP parallel region wants 1 thread (no oversubscription)."""
        names = {"set_num_threads": "openblas_set_num_threads",
                 "set_num_threads_local": "openblas_set_num_threads_local",
                 "get_num_threads": "openblas_get_num_threads"}
        return {k: (self.symbol(v) if self.exports(self.symbol(v)) else None)
                for k, v in names.items()}


@hookimpl
def register_blas(register):
    register(OpenBlasTarget())

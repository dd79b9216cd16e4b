"""BLAS target ``test-openblas``: PyPI scipy-openblas32, found through its own helpers."""

from pathlib import Path


class ScipyOpenBlas:
    """scipy-openblas32's OpenBLAS (symbols prefixed ``scipy_``)."""

    name = "test-openblas"

    def available(self):
        try:
            import scipy_openblas32  # noqa: F401
        except ImportError:
            return (False, "pip install scipy-openblas32")
        return (True, "")

    def symbol(self, routine):
        return "scipy_" + routine

    def compile_flags(self):
        import scipy_openblas32 as so
        return [f"-I{so.get_include_dir()}"]

    def link_flags(self):
        import scipy_openblas32 as so
        lib = Path(so.get_lib_dir())
        return [f"-L{lib}", f"-l{so.get_library()}", f"-Wl,-rpath,{lib}"]

    def thread_control(self):
        return {"set_num_threads": "scipy_openblas_set_num_threads",
                "set_num_threads_local": None,
                "get_num_threads": "scipy_openblas_get_num_threads"}

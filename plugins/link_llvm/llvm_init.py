"""One-time llvmlite initialisation (llvmlite 0.50: ``llvm.initialize()`` is gone and raises;
the native target and its assembly printer are what Ditto needs)."""

from functools import lru_cache


@lru_cache(maxsize=1)
def init_llvm() -> None:
    """Initialise llvmlite's native target, asm printer and asm parser (idempotent)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()

"""One-time llvmlite initialisation: the native target, its assembly printer and parser (what
Ditto needs; llvmlite >= 0.50 initialises its core itself and refuses ``llvm.initialize()``)."""

from functools import lru_cache


@lru_cache(maxsize=1)
def init_llvm() -> None:
    """Initialise llvmlite's native target, asm printer and asm parser (idempotent)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()

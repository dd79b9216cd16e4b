"""Ditto default plugin blas_accelerate: the BLAS target ``accelerate`` (macOS only).

Apple's Accelerate framework exports the CBLAS routines without prefix (``cblas_sgemv``); its
header is ``<Accelerate/Accelerate.h>`` (CBLAS lives in ``vecLib.framework/Headers/cblas.h``).
Compile with ``-DACCELERATE_NEW_LAPACK`` (the current interface, macOS 13.3+), link with
``-framework Accelerate``; no rpath is needed, the framework is part of the OS.

On any other platform ``available()`` is (False, "needs macOS") and the flag methods raise
DittoError. ``platform`` (default ``sys.platform``) exists so the flag generation can be tested
on Linux by pretending to be ``"darwin"``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ditto_core.base.errors import DittoError
from ditto_core.kit.hookspecs import hookimpl

VECLIB_HEADERS = ("System/Library/Frameworks/Accelerate.framework/Frameworks/"
                  "vecLib.framework/Headers")


def _default_sdk() -> Path | None:
    """The macOS SDK root from ``xcrun --show-sdk-path`` (None when xcrun is missing)."""
    try:
        out = subprocess.run(["xcrun", "--show-sdk-path"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


class AccelerateTarget:
    """BLAS target ``accelerate``.

    ``platform``: the ``sys.platform`` to assume; ``sdk``: the macOS SDK root whose vecLib
    headers hold ``cblas.h`` (default: ``xcrun --show-sdk-path``; None → rely on the
    compiler's framework search, ``#include <Accelerate/Accelerate.h>``).
    """

    name = "accelerate"

    def __init__(self, platform: str | None = None, sdk: Path | None = None):
        self.platform = platform or sys.platform
        self._sdk = sdk

    def available(self) -> tuple[bool, str]:
        if self.platform != "darwin":
            return (False, f"needs macOS (Accelerate framework); this is {self.platform}")
        return (True, "")

    def _require(self) -> None:
        ok, why = self.available()
        if not ok:
            raise DittoError(f"BLAS target 'accelerate' is not available: {why}; "
                             "use --blas openblas here")

    def symbol(self, routine: str) -> str:
        """Accelerate exports CBLAS unprefixed: "cblas_sgemv" → "cblas_sgemv"."""
        return routine

    def compile_flags(self) -> list[str]:
        """``-DACCELERATE_NEW_LAPACK`` plus ``-I<SDK>/…/vecLib.framework/Headers`` (so a plain
        ``#include <cblas.h>`` finds Accelerate's) when the SDK is known."""
        self._require()
        flags = ["-DACCELERATE_NEW_LAPACK"]
        sdk = self._sdk if self._sdk is not None else _default_sdk()
        if sdk is not None:
            flags.append(f"-I{Path(sdk) / VECLIB_HEADERS}")
        return flags

    def link_flags(self) -> list[str]:
        """``-framework Accelerate`` (a system framework: found at run time without rpath)."""
        self._require()
        return ["-framework", "Accelerate"]

    def thread_control(self) -> dict:
        """Accelerate has no per-call thread count API usable from plain C before macOS 15
        (``BLASSetThreading``); report none, so the pass keeps BLAS out of parallel regions
        or accepts the framework's own scheduling."""
        return {"set_num_threads": None, "set_num_threads_local": None, "get_num_threads": None}


@hookimpl
def register_blas(register):
    register(AccelerateTarget())

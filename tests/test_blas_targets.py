"""BLAS targets: symbols, compile/link flags, availability messages (incl. pretend-darwin)."""

import ctypes
import subprocess
from pathlib import Path

import pytest
import scipy_openblas32

from ditto_blas_accelerate import AccelerateTarget
from ditto_blas_mkl import MklTarget
from ditto_blas_openblas import OpenBlasTarget
from ditto_core.base.errors import DittoError, PluginError
from ditto_core.stages.plugins import get_registry


def test_registered_targets():
    reg = get_registry()
    assert {"openblas", "mkl", "accelerate"} <= set(reg.components["blas"])
    with pytest.raises(PluginError, match="available: accelerate, mkl, openblas"):
        reg.get("blas", "atlas")


def test_openblas_pypi_flags_and_symbols():
    t = OpenBlasTarget(system=False)
    assert t.available() == (True, "")
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    assert t.link_flags() == [f"-L{lib_dir}", f"-l{scipy_openblas32.get_library()}",
                              f"-Wl,-rpath,{lib_dir}"]
    inc = Path(scipy_openblas32.get_include_dir())
    assert t.compile_flags() == [f"-I{inc}"]
    assert t.symbol("cblas_sgemv") == "scipy_cblas_sgemv"
    # the names the target gives exist in the shared library it links
    lib = ctypes.CDLL(str(next(lib_dir.glob(f"lib{scipy_openblas32.get_library()}.so*"))))
    for sym in [t.symbol("cblas_sgemv"), t.symbol("cblas_dgemv")]:
        assert hasattr(lib, sym), sym
    tc = t.thread_control()
    assert tc["set_num_threads"] == "scipy_openblas_set_num_threads"
    assert tc["get_num_threads"] == "scipy_openblas_get_num_threads"
    # declared in cblas.h but not exported by this pthreads build: reported as absent
    assert tc["set_num_threads_local"] is None
    assert not hasattr(lib, "scipy_openblas_set_num_threads_local")
    header = (inc / "cblas.h").read_text()
    assert "scipy_cblas_sgemv" in header


def test_openblas_system_switch(monkeypatch, tmp_path):
    from ditto_core.base.options import configure, resolve

    monkeypatch.setenv("DITTO_OPENBLAS", "system")  # the deprecated alias of the option
    with pytest.warns(FutureWarning, match="use -O openblas.system=True"):
        t = configure(OpenBlasTarget(), resolve(OpenBlasTarget()))
    assert t.system and t.symbol("cblas_sgemv") == "cblas_sgemv"
    ok, why = t.available()
    if ok:  # the distribution's libopenblas is installed here
        assert t.link_flags() == ["-L/usr/lib/x86_64-linux-gnu", "-lopenblas",
                                  "-Wl,-rpath,/usr/lib/x86_64-linux-gnu"]
    else:
        assert "libopenblas" in why
        with pytest.raises(DittoError, match="not available.*libopenblas"):
            t.link_flags()
    monkeypatch.delenv("DITTO_OPENBLAS")
    assert not configure(OpenBlasTarget(), resolve(OpenBlasTarget())).system


def test_mkl_not_installed(tmp_path):
    t = MklTarget(prefix=tmp_path)  # an environment without libmkl_rt
    assert t.available() == (False, "not installed: pip install mkl-devel")
    with pytest.raises(DittoError, match="'mkl' is not available: not installed: pip install mkl-devel"):
        t.link_flags()
    with pytest.raises(DittoError, match="pip install mkl-devel"):
        t.compile_flags()
    assert t.symbol("cblas_sgemv") == "cblas_sgemv"


def test_mkl_found_in_prefix(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "include").mkdir()
    (tmp_path / "lib" / "libmkl_rt.so.2").write_bytes(b"")
    (tmp_path / "include" / "mkl_cblas.h").write_text("")
    t = MklTarget(prefix=tmp_path)
    assert t.available() == (True, "")
    assert t.compile_flags() == [f"-I{tmp_path / 'include'}"]
    assert t.link_flags() == [str(tmp_path / "lib" / "libmkl_rt.so.2"),
                              f"-Wl,-rpath,{tmp_path / 'lib'}"]
    (tmp_path / "lib" / "libmkl_rt.so").write_bytes(b"")
    assert t.link_flags() == [f"-L{tmp_path / 'lib'}", "-lmkl_rt",
                              f"-Wl,-rpath,{tmp_path / 'lib'}"]


def test_accelerate_pretend_darwin():
    sdk = Path("/Applications/Xcode.app/Contents/Developer/Platforms/MacOSX.platform/"
               "Developer/SDKs/MacOSX.sdk")
    t = AccelerateTarget(platform="darwin", sdk=sdk)
    assert t.available() == (True, "")
    assert t.symbol("cblas_sgemv") == "cblas_sgemv"
    assert t.link_flags() == ["-framework", "Accelerate"]
    flags = t.compile_flags()
    assert flags[0] == "-DACCELERATE_NEW_LAPACK"
    assert flags[1] == ("-I" + str(sdk) + "/System/Library/Frameworks/Accelerate.framework/"
                        "Frameworks/vecLib.framework/Headers")


def test_accelerate_on_linux_is_a_clear_error():
    t = AccelerateTarget(platform="linux")
    ok, why = t.available()
    assert not ok and "needs macOS" in why
    with pytest.raises(DittoError, match="'accelerate' is not available: needs macOS"):
        t.link_flags()
    with pytest.raises(DittoError, match="needs macOS"):
        t.compile_flags()


def test_openblas_links_and_runs(tmp_path):
    """A C program calling the prefixed symbol links with the target's flags and runs
    without LD_LIBRARY_PATH (rpath); sgemv result checked against a hand-computed product."""
    t = OpenBlasTarget(system=False)
    src = tmp_path / "s.c"
    src.write_text(
        '#include <stdio.h>\n#include <cblas.h>\n'
        "int main(void){ float A[6]={1,2,3,4,5,6}, x[3]={1,0,-1}, y[2]={0,0};\n"
        f" {t.symbol('cblas_sgemv')}(CblasRowMajor, CblasNoTrans, 2, 3, 1.0f, A, 3, x, 1,"
        " 0.0f, y, 1);\n printf(\"%g %g\\n\", y[0], y[1]); return 0; }\n")
    exe = tmp_path / "s"
    subprocess.run(["clang-22", str(src), "-o", str(exe), *t.compile_flags(),
                    *t.link_flags()], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    assert out.split() == ["-2", "-2"]

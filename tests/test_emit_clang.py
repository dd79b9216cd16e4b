"""IR emitter "clang": -O1 IR with Ditto's fast-math policy, multi-source linking, errors."""

import re
import subprocess

import llvmlite.binding as llvm
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.stages.plugins import get_registry
from ditto_emit_clang import FP_POLICY_FLAGS, ClangEmitter, link_ir_files

DOT = """
#include <math.h>
float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
int has_inf(const float *a, int n) {
    for (int i = 0; i < n; i++) if (isinf(a[i])) return 1;
    return 0;
}
"""


def _parse(text):
    llvm.initialize_native_target()
    llvm.initialize_native_asmparser()
    mod = llvm.parse_assembly(text)
    mod.verify()
    return mod


def test_registered():
    assert isinstance(get_registry().get("emitter", "clang"), ClangEmitter)


def test_policy_reassoc_without_finite_math(tmp_path):
    src = tmp_path / "dot.c"
    src.write_text(DOT)
    ir = ClangEmitter().emit([src], workdir=tmp_path / "w")
    mod = _parse(ir.text)
    assert {f.name for f in mod.functions if not f.is_declaration} == {"dot", "has_inf"}
    fadds = re.findall(r"= fadd ([a-z ]*)float", ir.text)
    assert fadds and all("reassoc" in f for f in fadds)
    # no finite-math assumptions: isinf survives (its compare against +inf is still there)
    flags = " ".join(re.findall(r"= f(?:add|mul|cmp) ([a-z ]*)", ir.text))
    assert "nnan" not in flags and "ninf" not in flags and " fast" not in f" {flags}"
    assert "0x7FF0000000000000" in ir.text
    assert "-ffast-math" not in FP_POLICY_FLAGS


def test_flags_override_policy(tmp_path):
    src = tmp_path / "dot.c"
    src.write_text(DOT)
    ir = ClangEmitter().emit([src], workdir=tmp_path, flags=["-fno-associative-math"])
    assert re.findall(r"= fadd ([a-z ]*)float", ir.text)
    assert "reassoc" not in ir.text


def test_defines_and_includes(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "k.h").write_text("#define K 41\n")
    src = tmp_path / "k.c"
    src.write_text('#include "k.h"\nint k(void) { return K + EXTRA; }\n')
    ir = ClangEmitter().emit([src], include_dirs=[tmp_path / "inc"], defines=["EXTRA=1"],
                             workdir=tmp_path)
    assert "ret i32 42" in ir.text


def test_two_sources_one_module(tmp_path):
    a, b = tmp_path / "a.c", tmp_path / "b.c"
    a.write_text("int twice(int x);\nint main(void) { return twice(21); }\n")
    b.write_text("int twice(int x) { return 2 * x; }\n")
    ir = ClangEmitter().emit([a, b], workdir=tmp_path / "w")
    mod = _parse(ir.text)
    assert {f.name for f in mod.functions if not f.is_declaration} == {"main", "twice"}
    assert ir.source == f"{a},{b}"


def test_llvmlite_fallback_link(tmp_path):
    """The llvmlite link_in path gives the same defined functions as llvm-link-22."""
    a, b = tmp_path / "a.c", tmp_path / "b.c"
    a.write_text("int g(int);\nint f(int x) { return g(x) + 1; }\n")
    b.write_text("int g(int x) { return x * 3; }\n")
    em = ClangEmitter()
    files = []
    for s in (a, b):
        out = tmp_path / (s.stem + ".ll")
        out.write_text(em.emit([s], workdir=tmp_path / s.stem).text)
        files.append(out)
    import ditto_emit_clang as ec
    real = ec.find_tool
    try:
        ec.find_tool = lambda name: None if "llvm-link" in name else real(name)
        text = link_ir_files(files, tmp_path / "merged.ll")
    finally:
        ec.find_tool = real
    mod = _parse(text)
    assert {f.name for f in mod.functions if not f.is_declaration} == {"f", "g"}


def test_compile_error_quotes_clang(tmp_path):
    src = tmp_path / "bad.c"
    src.write_text("int f(void) { return nope; }\n")
    with pytest.raises(DittoError) as ei:
        ClangEmitter().emit([src], workdir=tmp_path)
    assert str(src) in str(ei.value) and "use of undeclared identifier 'nope'" in str(ei.value)


def test_missing_and_empty(tmp_path):
    with pytest.raises(DittoError, match="no such C source file"):
        ClangEmitter().emit([tmp_path / "none.c"], workdir=tmp_path)
    with pytest.raises(DittoError, match="no C sources"):
        ClangEmitter().emit([], workdir=tmp_path)


def test_parallel_emit_reports_the_first_failing_source_in_order(tmp_path):
    """Sources compile concurrently; with two broken ones the error names the first in the
    order given (as a serial emit would), whichever clang finished first."""
    srcs = []
    for name, body in (("ok.c", "int a(void) { return 1; }\n"),
                       ("bad1.c", "int b(void) { return first_missing; }\n"),
                       ("bad2.c", "int c(void) { return second_missing; }\n")):
        (tmp_path / name).write_text(body)
        srcs.append(tmp_path / name)
    with pytest.raises(DittoError) as ei:
        ClangEmitter().emit(srcs, workdir=tmp_path / "w")
    msg = str(ei.value)
    assert msg.startswith(f"{srcs[1]}: clang-22 -emit-llvm failed (exit 1)")
    assert "'first_missing'" in msg and "second_missing" not in msg


#: the real Popen class, taken before any test replaces it
POPEN = subprocess.Popen


@pytest.fixture
def started(monkeypatch):
    """The Popen objects run_parallel starts, in order (the real Popen, recorded)."""
    import ditto_emit_clang as ec

    procs = []
    real_popen = POPEN

    def popen(*a, **kw):
        procs.append(real_popen(*a, **kw))
        return procs[-1]

    monkeypatch.setattr(ec.subprocess, "Popen", popen)
    return procs


def test_run_parallel_kills_children_when_interrupted(started, monkeypatch):
    """An exception while waiting (a stop signal's) kills and reaps every child still running."""
    import ditto_emit_clang as ec

    def interrupted(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(ec.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ec.run_parallel([(["sleep", "30"], "a"), (["sleep", "30"], "b"), (["sleep", "30"], "c")],
                        limit=2)
    assert len(started) == 2
    assert [p.returncode for p in started] == [-9, -9]


def test_run_parallel_reaps_children_when_a_poll_is_interrupted(started, monkeypatch):
    """A stop signal's exception inside Popen.poll can leave the Popen's wait lock held; the
    cleanup still kills and reaps the child instead of blocking on that lock."""
    import ditto_emit_clang as ec

    def poll_interrupted(self):
        self._waitpid_lock.acquire()  # as _internal_poll leaves it when interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(POPEN, "poll", poll_interrupted)
    with pytest.raises(KeyboardInterrupt):
        ec.run_parallel([(["sleep", "30"], "a")])
    assert [p.returncode for p in started] == [-9]

"""The executable and the shared library of one build link at the same time: the library's
passes and link run in a worker process (``python -m ditto_core.stages.link_worker``), and a
failure or stop on either side stops the worker and leaves no file. A two-file C program stands
in for the runtime (its compile takes seconds, not the runtime's ~20)."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import attrs
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.stages import compile as compile_mod
from ditto_core.stages.plugins import get_registry
from ditto_core.stages.selection import choose_compile
from ditto_link_llvm import LlvmLinker

MAIN_C = """#include <stdio.h>
int twice(int x);
int main(void) { printf("%d\\n", twice(21)); return 0; }
"""
LIB_C = """__attribute__((visibility("default"))) int twice(int x) { return 2 * x; }
"""


#: the linker command run by ``PidLinker(slow=...)``: logs its pid, sleeps, then links
SLOW = ("import os, sys, time\n"
        "open(sys.argv[1], 'a').write(f'{os.getpid()} slow\\n')\n"
        "time.sleep(60)\n"
        "os.execvp(sys.argv[2], sys.argv[2:])\n")


class PidLinker(LlvmLinker):
    """LlvmLinker that appends ``<pid> <output name>`` to ``log`` for every link (module level:
    the worker process unpickles it). The link of output ``fail`` raises a DittoError once a
    link of output ``wait_for`` has started (``kill``: a process other than the one that made
    this linker kills itself instead); the link of output ``slow`` runs its linker command
    behind a 60 s sleep (``SLOW``)."""

    name = "pid-llvm"

    def __init__(self, log: Path, fail: str | None = None, wait_for: str | None = None,
                 kill: bool = False, slow: str | None = None):
        super().__init__()
        self.log, self.fail, self.wait_for = Path(log), fail, wait_for
        self.kill, self.slow, self.owner = kill, slow, os.getpid()

    def link(self, module, blas, out, *, extra_flags=()):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {Path(out).name}\n")
        if Path(out).name == self.fail:
            if self.kill and os.getpid() != self.owner:
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while self.wait_for not in links(self.log) and time.monotonic() < deadline:
                time.sleep(0.01)
            raise DittoError(f"{out}: deliberately failed link")
        return super().link(module, blas, out, extra_flags=extra_flags)

    def link_command(self, obj, out, blas, openmp, extra_flags=()):
        cmd = super().link_command(obj, out, blas, openmp, extra_flags)
        if self.slow and Path(out).name.startswith(f".{self.slow}.tmp-"):
            return [sys.executable, "-c", SLOW, str(self.log), *cmd]
        return cmd


def stages_with(linker):
    s = choose_compile(get_registry(), blas=None, rewrite=False)
    return attrs.evolve(s, linker=attrs.evolve(s.linker, component=linker))


@pytest.fixture
def program(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.c").write_text(MAIN_C)
    (src / "lib.c").write_text(LIB_C)
    return [src / "lib.c", src / "main.c"]


def compile_both(program, stages, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    out, lib = tmp_path / "out" / "prog", tmp_path / "out" / "libprog.so"
    done = compile_mod.compile_with_library(program, stages, out, lib, workdir=work)
    return out, lib, done


def links(log: Path) -> dict:
    """output name (or ``slow``) -> pid, from a PidLinker log"""
    return {name: int(pid) for pid, name in
            (line.split() for line in log.read_text().splitlines())}


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True)
def time_limit():
    """A test that would wait forever fails after 120 s instead."""
    def expire(signum, frame):
        raise TimeoutError("test_compile_library: 120 s passed")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_library_links_in_a_worker_process_beside_the_executable(program, tmp_path):
    log = tmp_path / "links.log"
    out, lib, done = compile_both(program, stages_with(PidLinker(log)), tmp_path)
    pids = links(log)
    assert pids["prog"] == os.getpid() and pids["libprog.so"] != os.getpid()
    assert subprocess.run([str(out)], capture_output=True, text=True).stdout == "42\n"
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                        text=True).stdout
    assert "twice" in nm.split() and "main" not in nm.split()
    assert set(done.seconds) == {"emit IR", "rewrite", "link"}


def test_failed_library_link_is_the_workers_message(program, tmp_path):
    log = tmp_path / "links.log"
    with pytest.raises(DittoError) as e:
        compile_both(program, stages_with(PidLinker(log, fail="libprog.so", wait_for="prog")),
                     tmp_path)
    assert str(e.value) == f"{tmp_path / 'out' / 'libprog.so'}: deliberately failed link"
    assert links(log)["libprog.so"] != os.getpid()
    assert list((tmp_path / "out").glob("*")) == []  # the executable linked, then removed


def test_executable_failure_stops_the_library_link_and_its_linker(program, tmp_path):
    log = tmp_path / "links.log"
    linker = PidLinker(log, fail="prog", wait_for="slow", slow="libprog.so")
    t = time.monotonic()
    with pytest.raises(DittoError, match="prog: deliberately failed link"):
        compile_both(program, stages_with(linker), tmp_path)
    assert time.monotonic() - t < 50  # the 60 s linker was stopped, not waited for
    pids = links(log)
    assert gone([pids["libprog.so"], pids["slow"]], 5)
    assert list((tmp_path / "out").glob("*")) == []  # nor the worker's .libprog.so.tmp-PID
    assert not list(Path(tempfile.gettempdir()).glob(f"ditto-link-{pids['libprog.so']}-*"))


def test_killed_worker_is_an_error_naming_the_signal(program, tmp_path):
    log = tmp_path / "links.log"
    with pytest.raises(DittoError, match=r"libprog.so: the library's link worker was killed "
                                         r"by SIGKILL"):
        compile_both(program, stages_with(PidLinker(log, fail="libprog.so", kill=True)),
                     tmp_path)
    assert list((tmp_path / "out").glob("*")) == []


def test_component_the_worker_cannot_import_links_in_this_process(program, tmp_path,
                                                                   monkeypatch):
    # a class pickle finds in sys.modules but a new interpreter cannot import (as one
    # defined in a script's __main__)
    mod = types.ModuleType("ditto_test_ephemeral_linkers")
    linker_cls = type("EphemeralLinker", (PidLinker,), {"__module__": mod.__name__})
    mod.EphemeralLinker = linker_cls
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    log = tmp_path / "links.log"
    out, lib, _ = compile_both(program, stages_with(linker_cls(log)), tmp_path)
    assert links(log) == {"prog": os.getpid(), "libprog.so": os.getpid()}
    assert "cannot load the link job" in (tmp_path / "work" / "library-link.log").read_text()
    assert not (tmp_path / "work" / "library-link.pickle.started").exists()
    assert subprocess.run([str(out)], capture_output=True, text=True).stdout == "42\n"
    assert lib.is_file()


def test_unpicklable_linker_links_the_library_in_this_process(program, tmp_path):
    class LocalLinker(PidLinker):  # a local class: pickle cannot name it
        pass

    log = tmp_path / "links.log"
    stages = stages_with(LocalLinker(log))
    assert compile_mod.start_library_link(stages, None, None, tmp_path / "x", tmp_path) is None
    assert not (tmp_path / "library-link.pickle").exists()
    out, lib, _ = compile_both(program, stages, tmp_path)
    assert links(log) == {"prog": os.getpid(), "libprog.so": os.getpid()}
    assert subprocess.run([str(out)], capture_output=True, text=True).stdout == "42\n"
    assert lib.is_file()


PARENT = """import sys
from pathlib import Path
from tests.test_compile_library import PidLinker, compile_both, stages_with
tmp = Path(sys.argv[1])
program = [tmp / "src" / "lib.c", tmp / "src" / "main.c"]
compile_both(program, stages_with(PidLinker(tmp / "links.log", slow="libprog.so")), tmp)
"""


def test_worker_stops_when_the_build_is_killed(program, tmp_path):
    root = Path(__file__).resolve().parents[1]
    build = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=root)
    log = tmp_path / "links.log"
    deadline = time.monotonic() + 90
    while not (log.exists() and "slow" in links(log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = links(log)
    build.kill()  # SIGKILL: the build runs no cleanup
    build.wait()
    # the worker sees that its parent is gone and stops its link, killing the linker
    assert gone([pids["libprog.so"], pids["slow"]], 10)
    assert not (tmp_path / "out" / "libprog.so").exists()

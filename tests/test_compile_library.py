"""The executable and the shared library of one build link at the same time: the library's
passes and link run in a worker process (``compile.library_worker``), and a failure on either
side leaves neither file. A two-file C program stands in for the runtime (its compile takes
seconds, not the runtime's ~20)."""

import os
import subprocess
import time
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


class PidLinker(LlvmLinker):
    """LlvmLinker that appends ``<pid> <output name>`` to ``log`` for every link, and fails
    the link whose output is named ``fail`` once the other link has started (module level: a
    worker process unpickles it)."""

    name = "pid-llvm"

    def __init__(self, log: Path, fail: str | None = None):
        super().__init__()
        self.log, self.fail = Path(log), fail

    def link(self, module, blas, out, *, extra_flags=()):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {Path(out).name}\n")
        if Path(out).name == self.fail:
            deadline = time.monotonic() + 60
            while len(links(self.log)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            raise DittoError(f"{out}: deliberately failed link")
        return super().link(module, blas, out, extra_flags=extra_flags)


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
    return {name: int(pid) for pid, name in
            (line.split() for line in log.read_text().splitlines())}


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


@pytest.mark.parametrize("fail", ["prog", "libprog.so"])
def test_failed_link_on_either_side_leaves_neither_file(program, tmp_path, fail):
    log = tmp_path / "links.log"
    with pytest.raises(DittoError, match=f"{fail}: deliberately failed link"):
        compile_both(program, stages_with(PidLinker(log, fail=fail)), tmp_path)
    assert sorted(links(log)) == ["libprog.so", "prog"]
    assert list((tmp_path / "out").glob("*")) == []  # nor the worker's temp file


def test_unpicklable_linker_links_the_library_in_this_process(program, tmp_path):
    class LocalLinker(PidLinker):  # a local class: a new interpreter cannot import it
        pass

    log = tmp_path / "links.log"
    stages = stages_with(LocalLinker(log))
    assert compile_mod.library_worker(stages, None) is None
    out, lib, _ = compile_both(program, stages, tmp_path)
    assert links(log) == {"prog": os.getpid(), "libprog.so": os.getpid()}
    assert subprocess.run([str(out)], capture_output=True, text=True).stdout == "42\n"
    assert lib.is_file()

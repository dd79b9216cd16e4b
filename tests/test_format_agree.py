"""native/ditto_format.h and ditto_core/format.py describe the same file layout.

The C side is read two ways: the ``#define`` constants are parsed from the header text, and the
struct layouts come from a small C program compiled with clang-22 that prints ``sizeof`` and
``offsetof`` of every field, so the check covers what the C compiler actually lays out.
"""

import re
import shutil
import subprocess

import pytest

from ditto_core import format as F
from ditto_native import SOURCE_DIR

HEADER = SOURCE_DIR / "ditto_format.h"
CC = shutil.which("clang-22") or "clang-22"


def c_defines() -> dict[str, str]:
    out = {}
    for m in re.finditer(r"^#define[ \t]+DITTO_(\w+)[ \t]+(\S+)", HEADER.read_text(), re.M):
        out[m.group(1)] = m.group(2)
    return out


def test_every_define_matches_python():
    defines = c_defines()
    assert len(defines) >= 20  # guard against a parser that silently matches nothing
    for name, value in defines.items():
        if name == "FORMAT_H":
            continue
        assert hasattr(F, name), f"format.py lacks DITTO_{name}"
        if value.startswith('"'):
            assert getattr(F, name) == value.strip('"').encode(), name
        else:
            assert getattr(F, name) == int(value.rstrip("uU"), 0), name


def test_python_enums_cover_the_c_constants():
    d = c_defines()
    assert sorted(F.ENCODINGS.values()) == sorted(int(v.rstrip("u")) for k, v in d.items()
                                                  if k.startswith("ENC_"))
    assert sorted(F.TOKENIZER_KINDS.values()) == sorted(int(v.rstrip("u")) for k, v in d.items()
                                                        if k.startswith("TOK_"))
    assert sorted(F.PRE_TOKENIZERS.values()) == sorted(int(v.rstrip("u")) for k, v in d.items()
                                                       if k.startswith("PRE_"))
    assert sorted(F.CHAT_FORMATS.values()) == sorted(int(v.rstrip("u")) for k, v in d.items()
                                                     if k.startswith("CHAT_"))


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field) -> (offsetof, sizeof field), and (struct, "") -> (0, sizeof struct),
    printed by a C program compiled with clang-22."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "ditto_format.h"',
             "int main(void) {"]
    for struct_name, (_, fields) in F.STRUCTS.items():
        lines.append(f'  printf("{struct_name} - 0 %zu\\n", sizeof({struct_name}));')
        for f in fields:
            lines.append(f'  printf("{struct_name} {f} %zu %zu\\n", offsetof({struct_name}, {f}),'
                         f' sizeof((({struct_name} *)0)->{f}));')
    lines += ["  return 0;", "}"]
    d = tmp_path_factory.mktemp("format_agree")
    (d / "layout.c").write_text("\n".join(lines) + "\n")
    exe = d / "layout"
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{SOURCE_DIR}",
                    str(d / "layout.c"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        s, f, a, b = line.split()
        layout[(s, "" if f == "-" else f)] = (int(a), int(b))
    return layout


@pytest.mark.parametrize("struct_name", list(F.STRUCTS))
def test_struct_layout_matches_c(c_layout, struct_name):
    st, fields = F.STRUCTS[struct_name]
    assert c_layout[(struct_name, "")][1] == st.size
    offsets = F.field_offsets(st, fields)
    codes = F._split_format(st.format)
    for f, code in zip(fields, codes):
        c_off, c_size = c_layout[(struct_name, f)]
        assert offsets[f] == c_off, (struct_name, f)
        assert __import__("struct").calcsize("<" + code) == c_size, (struct_name, f)

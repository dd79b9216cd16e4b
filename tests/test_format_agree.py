"""native/model/ditto_format.h and ditto_core/model/format.py describe the same file layout.

The C side is read two ways: the ``#define`` constants are parsed from the header text, and the
struct layouts come from a small C program compiled with clang-22 that prints ``sizeof`` and
``offsetof`` of every field, so the check covers what the C compiler actually lays out.
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

from ditto_core.model import format as F
from ditto_native import SOURCE_DIR

HEADER = SOURCE_DIR / "model" / "ditto_format.h"
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
    assert sorted(F.ARCHITECTURES.values()) == sorted(int(v.rstrip("u")) for k, v in d.items()
                                                      if k.startswith("ARCH_"))
    assert F.ARCHITECTURES == {"llama": 1, "qwen2": 2}


def run_c_program(lines: list[str], exe) -> str:
    """Compile the C program ``lines`` (the body of ``main`` left open: ``return 0; }`` is
    added) with clang-22 -Wall -Wextra -Werror against native/, run it, return its stdout."""
    src = exe.with_suffix(".c")
    src.write_text("\n".join([*lines, "  return 0;", "}"]) + "\n")
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{SOURCE_DIR}", str(src),
                    "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field) -> (offsetof, sizeof field), and (struct, "") -> (0, sizeof struct),
    printed by a C program compiled with clang-22."""
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "model/ditto_format.h"',
             "int main(void) {"]
    for struct_name, (_, fields) in F.STRUCTS.items():
        lines.append(f'  printf("{struct_name} - 0 %zu\\n", sizeof({struct_name}));')
        for f in fields:
            lines.append(f'  printf("{struct_name} {f} %zu %zu\\n", offsetof({struct_name}, {f}),'
                         f' sizeof((({struct_name} *)0)->{f}));')
    out = run_c_program(lines, tmp_path_factory.mktemp("format_agree") / "layout")
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


# ---- the CODEBOOK encoding: ditto_core/model/codebook.py and the header's ditto_cb_* functions

#: (rows, cols, b, G): G dividing cols or not, G >= cols, tails of the 8-index groups, b = 1..8
CB_CASES = [(1, 1, 1, 2), (3, 10, 3, 4), (2, 9, 2, 16), (576, 1536, 4, 256), (7, 13, 5, 3),
            (49152, 576, 6, 576), (5, 1000, 7, 64), (4, 300, 8, 2), (1, 65, 4, 16777216)]


@pytest.fixture(scope="module")
def c_codebook(tmp_path_factory) -> dict[str, list[int]]:
    """What the header's ditto_cb_* functions give, printed by a clang-22 program: per codebook
    type id its element and scale bytes, per (case, type) the sizes, and the indices a packed
    row decodes to."""
    from ditto_core.model import codebook as CB

    lines = ['#include <inttypes.h>', '#include <stdio.h>', '#include "model/ditto_format.h"',
             "int main(void) {"]
    for t in range(4):
        lines.append(f'  printf("type {t} %" PRIu64 " %" PRIu64 "\\n", ditto_cb_elem_bytes({t}u),'
                     f' ditto_cb_scale_bytes({t}u));')
    for i, (r, c, b, g) in enumerate(CB_CASES):
        for name, t in CB.TYPE_IDS.items():
            args = f"{r}u, {c}u, {b}u, {g}u, {t}u"
            lines.append(
                f'  printf("size {i} {name} %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %"'
                f' PRIu64 " %" PRIu64 "\\n", ditto_cb_n_sub({c}u, {g}u), '
                f'ditto_cb_row_bytes({c}u, {b}u), ditto_cb_centroid_bytes({args}), '
                f'ditto_cb_codebook_bytes({args}), ditto_cb_payload_bytes({args}), '
                f'(uint64_t)(1u << {b}u));')
    rng = np.random.default_rng(7)
    for b in range(1, 9):
        idx = rng.integers(0, 1 << b, size=(1, 21), dtype=np.uint8)
        packed = CB.pack_indices(idx, b)[0]
        arr = ", ".join(str(int(x)) for x in packed)
        lines.append(f"  {{ static const uint8_t row[] = {{{arr}}};")
        lines.append(f'    printf("index {b}"); for (int c = 0; c < 21; c++) '
                     f'printf(" %u", ditto_cb_index(row, (uint64_t)c, {b}u)); printf("\\n"); }}')
        lines.append(f'  printf("want {b} {" ".join(str(int(x)) for x in idx[0])}\\n");')
    out = run_c_program(lines, tmp_path_factory.mktemp("codebook_agree") / "cb")
    return {" ".join(line.split()[:3 if line.startswith("size") else 2]):
            [int(x) for x in line.split()[3 if line.startswith("size") else 2:]]
            for line in out.splitlines()}


def test_codebook_types_match_c(c_codebook):
    from ditto_core.model import codebook as CB

    for name, t in CB.TYPE_IDS.items():
        assert c_codebook[f"type {t}"] == [CB.ITEMSIZE[name], CB.SCALE_BYTES[name]], name
    unknown = max(CB.TYPE_IDS.values()) + 1
    assert c_codebook[f"type {unknown}"] == [0, 0]  # the loader refuses it
    assert sorted(CB.TYPE_IDS.values()) == sorted(
        int(v.rstrip("u")) for k, v in c_defines().items() if k.startswith("CB_"))


@pytest.mark.parametrize("case", range(len(CB_CASES)))
def test_codebook_sizes_match_c(c_codebook, case):
    from ditto_core.model import codebook as CB

    r, c, b, g = CB_CASES[case]
    for name in CB.TYPE_IDS:
        n_sub, row_bytes, cent, cb_bytes, payload, k = c_codebook[f"size {case} {name}"]
        assert n_sub == CB.n_sub_blocks(c, g)
        assert row_bytes == CB.row_bytes(c, b)
        assert k == CB.n_centroids(b)
        assert cent == r * n_sub * k * CB.ITEMSIZE[name]
        assert cb_bytes == CB.codebook_bytes(r, c, b, g, name)
        assert payload == CB.payload_bytes(r, c, b, g, name)
        # the theoretical size is the payload without its padding
        assert CB.theoretical_bytes(r, c, b, g, name) <= payload < (
            CB.theoretical_bytes(r, c, b, g, name) + F.ALIGN + r * b)


@pytest.mark.parametrize("bits", range(1, 9))
def test_index_unpacking_matches_c(c_codebook, bits):
    """ditto_cb_index reads back what codebook.pack_indices wrote."""
    assert c_codebook[f"index {bits}"] == c_codebook[f"want {bits}"]

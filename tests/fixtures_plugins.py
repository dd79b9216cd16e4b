"""The example third-party distribution examples/ditto-test-plugin, pip-installed once per
session (it registers one replacement component per stage)."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ditto-test-plugin"


def _pip(*args):
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q",
                           *args], check=True, capture_output=True, text=True)


def _installed(example: Path, tmp_path_factory):
    """pip-install a copy of the example distribution ``example`` (so the build leaves nothing
    in the source tree), yield, uninstall."""
    src = tmp_path_factory.mktemp(example.name) / example.name
    shutil.copytree(example, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    _pip("install", "--no-deps", "--no-build-isolation", str(src))
    importlib.invalidate_caches()
    try:
        yield example.name
    finally:
        _pip("uninstall", "-y", example.name)


@pytest.fixture(scope="session")
def test_plugin_installed(tmp_path_factory):
    """examples/ditto-test-plugin (one replacement component per stage), pip-installed."""
    yield from _installed(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="session")
def quantile_plugin_installed(tmp_path_factory):
    """examples/ditto-quant-quantile (the quantizer-kit example), pip-installed."""
    yield from _installed(EXAMPLE.parent / "ditto-quant-quantile", tmp_path_factory)

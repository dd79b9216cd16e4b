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


@pytest.fixture(scope="session")
def test_plugin_installed(tmp_path_factory):
    """pip-installs examples/ditto-test-plugin into this environment; uninstalls at the end.
    Installs from a copy so the build leaves nothing in the source tree."""
    src = tmp_path_factory.mktemp("plugin_src") / EXAMPLE.name
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    _pip("install", "--no-deps", "--no-build-isolation", str(src))
    importlib.invalidate_caches()
    try:
        yield "ditto-test-plugin"
    finally:
        _pip("uninstall", "-y", "ditto-test-plugin")




@pytest.fixture(scope="session")
def quantile_plugin_installed(tmp_path_factory):
    """pip-installs examples/ditto-quant-quantile (the quantizer-kit example) from a copy;
    uninstalls at the end."""
    example = EXAMPLE.parent / "ditto-quant-quantile"
    src = tmp_path_factory.mktemp("quantile_src") / example.name
    shutil.copytree(example, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    _pip("install", "--no-deps", "--no-build-isolation", str(src))
    importlib.invalidate_caches()
    try:
        yield "ditto-quant-quantile"
    finally:
        _pip("uninstall", "-y", "ditto-quant-quantile")

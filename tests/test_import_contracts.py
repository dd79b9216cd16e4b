"""The import layers of docs/ARCHITECTURE.md ("Layers"): the contracts in .importlinter hold
(`lint-imports`; imports inside functions count: the layers between ditto_core's packages and
inside each, no circle, the kit and the plugins kept low), and what a plugin imports of
ditto_core (the quantizer kit, the hook marker) loads neither the command line, nor the
evaluation harness, nor torch."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    """Every contract of .importlinter is kept; on failure the assertion shows lint-imports'
    report (which contract, which import chain, the line numbers)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache", "--config", ".importlinter"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "0 broken" in report and "13 kept" in report, report


def test_plugin_kit_import_loads_no_cli_eval_or_torch():
    """A quantizer plugin's imports, in a fresh interpreter: ``ditto_core.kit.quantkit`` and the
    ``hookimpl`` marker load nothing of ditto_core.cli, ditto_core.api, ditto_core.stages (the
    pipeline, compile, cc), ditto_core.eval (calibration included), ditto_core.runtime or
    ditto_core.serve, and neither torch nor click."""
    code = ("import json, sys\n"
            "import ditto_core.kit.quantkit\n"
            "from ditto_core.kit.hookspecs import hookimpl\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert {"ditto_core.kit.quantkit", "ditto_core.kit.hookspecs",
            "ditto_core.kit.importance"} <= loaded
    upper = ("ditto_core.cli", "ditto_core.api", "ditto_core.stages", "ditto_core.eval",
             "ditto_core.runtime", "ditto_core.serve")
    bad = sorted(m for m in loaded
                 if m.startswith(upper) or m.split(".")[0] in ("torch", "transformers", "click"))
    assert bad == []

"""User text is never parsed as rich markup (issue: reliability): a path holding `[/]` or
`[red]` prints literally in `ditto inspect` (its console has markup off; the progress bars'
description columns too)."""

import shutil

import pytest
from click.testing import CliRunner

from ditto_core.cli.main import cli


@pytest.mark.parametrize("name", ["a[/]b.ditto", "[red]m.ditto", "[bold]x[/bold].ditto"])
def test_inspect_prints_markup_like_paths_literally(tiny_f32_ditto, tmp_path, name):
    f = tmp_path / name
    f.parent.mkdir(exist_ok=True)
    shutil.copyfile(tiny_f32_ditto, f)
    r = CliRunner().invoke(cli, ["inspect", str(f)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].startswith(f"{f}  Ditto format v")
    assert "Traceback" not in r.output

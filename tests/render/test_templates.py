"""The templates: one folder at the top of the repository (``templates/``), rendered by Jinja2
with ``StrictUndefined``, and a dry run that loads no heavy module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.render import templates
from tests.conftest import ROOT


def test_the_templates_are_the_top_level_folder() -> None:
    assert templates.TEMPLATES.resolve() == (ROOT / "templates").resolve()
    names = sorted(
        p.relative_to(templates.TEMPLATES).as_posix() for p in templates.TEMPLATES.rglob("*.j2")
    )
    assert names == [
        "cluster/dnsmasq.conf.j2",
        "cluster/gres.conf.j2",
        "cluster/oci.conf.j2",
        "cluster/slurm.conf.j2",
        "slurm/launch.sh.j2",
        "slurm/modules.sh.j2",
        "slurm/sbatch.sh.j2",
    ]


def test_a_missing_value_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("a {{ given }} b {{ forgotten }}\n")
    with pytest.raises(Exception, match="forgotten"):
        templates.render_template("t.j2", tmp_path, given="x")


def test_a_dry_run_imports_neither_submitit_nor_torch() -> None:
    argv = [sys.executable, "-X", "importtime", "-m", "clustertrain", "submit", "--dry-run"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()]
    assert "jinja2" in imported  # the check reads the import list: it would see these too
    assert "submitit" not in imported and "torch" not in imported

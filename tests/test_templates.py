"""Templates compiled once and run without Jinja2 (clustertrain.render.templates) give exactly
what Jinja2 gives, for every rendered case; what the stand-in runtime cannot run goes to Jinja2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.cluster import config, layout
from clustertrain.render import jinja_runtime, scripts, templates
from clustertrain.spec import build_spec
from tests.conftest import ROOT
from tests.test_render import CASES, RUN_DIR, WORKDIR


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "clustertrain" / "templates"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_job_script_is_what_jinja2_renders(
    case: str, fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = build_spec(**CASES[case])
    first = scripts.render(spec, RUN_DIR, WORKDIR)  # compiles and keeps the code
    again = scripts.render(spec, RUN_DIR, WORKDIR)  # runs the kept code
    kept = sorted(p.name.split("%")[-1] for p in fresh_cache.iterdir())
    assert [name.split(".")[0] for name in kept] == ["launch", "sbatch"]
    monkeypatch.setattr(scripts, "render_template", templates.render_with_jinja)
    assert first == again == scripts.render(spec, RUN_DIR, WORKDIR)


def test_the_cluster_configuration_is_what_jinja2_renders(fresh_cache: Path) -> None:
    shape = layout.Layout(nodes=3, cpus_per_node=2, gpus_per_node=2, state_dir=Path("/c"))
    ours = config.render_slurm_conf(shape, "host")
    ours_gres, ours_oci = config.render_gres_conf(shape), config.render_oci_conf(shape)
    assert list(fresh_cache.iterdir())  # some run on the stand-in, the rest through Jinja2
    real = templates.render_with_jinja
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config, "render_template", real)
        assert ours == config.render_slurm_conf(shape, "host")
        assert (ours_gres, ours_oci) == (
            config.render_gres_conf(shape),
            config.render_oci_conf(shape),
        )


def test_a_missing_value_is_an_error_both_ways(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("a {{ given }} b {{ forgotten }}\n")
    for render in (templates.render_template, templates.render_with_jinja):
        with pytest.raises(Exception, match="forgotten"):
            render("t.j2", tmp_path, given="x")


def test_what_the_stand_in_cannot_run_is_rendered_by_jinja2(
    tmp_path: Path, fresh_cache: Path
) -> None:
    (tmp_path / "loop.j2").write_text("{% for x in xs %}{{ loop.index }}={{ x }} {% endfor %}")
    assert templates.render_template("loop.j2", tmp_path, xs=["a", "b"]) == "1=a 2=b "
    assert not fresh_cache.exists() or not list(fresh_cache.iterdir())  # nothing kept


def test_an_unwritable_cache_still_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file: no folder can be made in it
    job = scripts.render(build_spec(nodes=2), RUN_DIR, WORKDIR)
    assert job.batch_script.startswith("#!/bin/bash\n")


def test_code_that_reaches_beyond_the_stand_in_is_refused() -> None:
    head = "from jinja2.runtime import LoopContext, missing\n"
    assert jinja_runtime.portable(head + "def root(context):\n    yield 'x'\n") is not None
    assert jinja_runtime.portable(head + "def root(context):\n    LoopContext(1)\n") is None
    assert jinja_runtime.portable(head + "x = environment.policies\n") is None
    assert jinja_runtime.portable("import os\n") is None


def test_a_dry_run_imports_no_jinja2_once_compiled() -> None:
    argv = [sys.executable, "-X", "importtime", "-m", "clustertrain", "submit", "--dry-run"]
    subprocess.run(argv, cwd=ROOT, capture_output=True, check=True)  # compiles if needed
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()]
    assert "jinja2" not in imported and "submitit" not in imported and "yaml" not in imported

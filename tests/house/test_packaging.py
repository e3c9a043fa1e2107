"""What a `pip install` gets: the wheel and the sdist hold the library, the top-level
``templates/`` (as ``clustertrain.templates``) and the top-level ``jobs/`` (the MNIST entrypoint
and its job files), and pyproject.toml lists every package folder.

The job an installed clustertrain runs from an empty folder, on the real cluster, is in
tests/e2e/test_install_e2e.py."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT, build_wheel, source_copy

# What the headline command needs from an install, as the wheel names them.
NEEDED = (
    "clustertrain/templates/slurm/sbatch.sh.j2",
    "clustertrain/templates/slurm/launch.sh.j2",
    "clustertrain/templates/cluster/slurm.conf.j2",
    "clustertrain/templates/cluster/gres.conf.j2",
    "clustertrain/templates/cluster/dnsmasq.conf.j2",
    "clustertrain/templates/cluster/oci.conf.j2",
    "jobs/mnist/train.py",
    "jobs/mnist/data.py",
    "jobs/mnist.yaml",
    "jobs/mnist-accelerate.yaml",
    "jobs/examples/accelerate_preemptible.py",
    "clustertrain/cli/__init__.py",
)


def test_every_package_folder_is_listed() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("clustertrain", "jobs")
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert listed == found | {"clustertrain.templates"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


def test_the_wheel_holds_the_templates_and_the_jobs(built: Path) -> None:
    with zipfile.ZipFile(built) as archive:
        names = set(archive.namelist())
    assert [n for n in NEEDED if n not in names] == []
    assert not [n for n in names if n.startswith(("templates/", "tests/", "bench/"))]


def test_the_sdist_holds_the_top_level_folders(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta as b; "
         f"b.build_sdist({str(tmp_path)!r})"],
        cwd=source_copy(tmp_path), check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    (sdist,) = tmp_path.glob("clustertrain-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    wanted = ["templates/slurm/sbatch.sh.j2", "templates/cluster/slurm.conf.j2"]
    wanted += ["jobs/mnist.yaml", "jobs/mnist/train.py", "templates/__init__.py"]
    assert [n for n in wanted if n not in names] == []

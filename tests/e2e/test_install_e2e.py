"""The headline command from a pip install, as a new user runs it: the wheel built from this
checkout, installed with its training extras into a fresh virtual environment (torch from
this machine's disk, as pip finds it), and `clustertrain submit --nodes 2 --gpus-per-node 1`
from an empty folder, with no job file: the MNIST job the wheel carries is prepared here,
queued on the real local cluster and followed to COMPLETED."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_wheel
from tests.e2e.test_slurm_e2e import cluster  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its training extras; its bin/ folder."""
    where = tmp_path_factory.mktemp("install")
    wheel = build_wheel(where)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         "torch==2.14.1", "torchvision==0.29.1", f"{wheel}[train]"],
        check=True, timeout=900, capture_output=True,
    )  # fmt: skip
    return venv / "bin"


def _run(
    bin_dir: Path, *args: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "clustertrain"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_the_installed_clustertrain_runs_nothing_of_this_checkout(installed: Path) -> None:
    code = "import clustertrain, jobs.mnist.train as t, clustertrain.render.templates as r; "
    code += "print(clustertrain.__file__, t.__file__, r.TEMPLATES)"
    done = subprocess.run(
        [str(installed / "python"), "-c", code], cwd="/", capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    paths = done.stdout.split()
    assert all(p.startswith(str(installed.parent)) for p in paths), paths


def test_the_headline_command_from_an_empty_folder_completes(
    cluster: None,  # noqa: F811
    installed: Path,
    tmp_path: Path,
    data_dir: Path,
) -> None:
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {
        "PATH": f"{installed}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERTRAIN_DATA_DIR": str(data_dir),
        "SLURM_CONF": os.environ["SLURM_CONF"],  # as `cluster up` told the user to export
    }
    dry = _run(installed, "submit", "--nodes", "2", "--gpus-per-node", "1", "--dry-run",
               cwd=empty, env=env)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "-m jobs.mnist.train" in dry.stdout and "python -m jobs.mnist.data" in dry.stdout
    submitted = _run(installed, "submit", "--nodes", "2", "--gpus-per-node", "1",
                     cwd=empty, env=env)  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "prepare | " in submitted.stderr + submitted.stdout
    followed = _run(installed, "logs", "last", "--follow", cwd=empty, env=env, timeout=900)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    status = _run(installed, "status", "last", cwd=empty, env=env)
    found = re.search(r"final test_acc (0\.\d+)", status.stdout)
    assert found and float(found[1]) >= 0.99, status.stdout
    assert sorted(os.listdir(empty)) == []  # nothing written where the user stood


def test_a_module_the_job_cannot_import_is_refused_before_queueing(
    cluster: None,  # noqa: F811
    installed: Path,
    tmp_path: Path,
) -> None:
    env = {"PATH": f"{installed}:/usr/bin:/bin", "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    words = ["--module", "nosuch.mod", "--nodes", "2", "--cpus-per-task", "2"]
    done = _run(installed, "submit", *words, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("clustertrain: error: module: nosuch.mod cannot be imported")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()

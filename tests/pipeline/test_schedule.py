"""submit = schedule(render(spec)): what is left behind when a step fails, and the submitit path."""

from __future__ import annotations

import errno
import inspect
from pathlib import Path

import pytest
import submitit

from clustertrain import runs
from clustertrain.backends.slurm import Slurm, SlurmBackend, parse_nodes, parse_partitions
from clustertrain.backends.slurm.cluster_info import ClusterInfo
from clustertrain.errors import UserError
from clustertrain.pipeline.schedule import schedule
from clustertrain.render import render
from tests.conftest import ROOT, job_spec


class QueuedSlurm(Slurm):
    """sbatch accepted the job (id 42)."""

    def submit(self, job: object) -> str:
        return "42"


class RefusingSlurm(Slurm):
    def submit(self, job: object) -> str:
        raise UserError("sbatch failed: Invalid account")


def _job(tmp_path: Path) -> object:
    return render(job_spec(nodes=2), str(runs.new_run_dir(tmp_path, "mnist")), "/w")


def test_a_queued_job_keeps_its_run_folder_when_its_id_cannot_be_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(job: object, job_id: str, backend: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runs, "record_submission", full_disk)
    job = _job(tmp_path)
    with pytest.raises(UserError, match=r"job 42 is queued.*scancel 42"):
        schedule(job, SlurmBackend(QueuedSlurm()), check=False)  # type: ignore[arg-type]
    folder = Path(job.run_dir)  # type: ignore[attr-defined]
    assert (folder / "launch.sh").is_file() and (folder / "job.sbatch").is_file()


def test_a_refused_submission_leaves_nothing(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(UserError, match="Invalid account"):
        schedule(job, SlurmBackend(RefusingSlurm()), check=False)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


class SmallCluster(QueuedSlurm):
    """The local cluster's shape: 2 CPUs and 2 GPUs a node; says how often it was asked."""

    asked = 0

    def cluster_info(self) -> ClusterInfo:
        self.asked += 1
        nodes = "".join(f"node{k}|debug*|2|4096|gpu:2|idle\n" for k in (1, 2))
        parts = "PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED State=UP\n"
        return ClusterInfo("slurm 22.05", parse_partitions(parts), parse_nodes(nodes))


def test_a_submission_fits_the_default_cpus_to_the_partition_and_writes_what_it_fitted(
    tmp_path: Path,
) -> None:
    """4 CPUs per GPU cannot run on 2 CPUs for 2 GPUs: the run folder's script asks 1 per GPU,
    its plan's steps too; preflight asked the cluster once for both; --no-preflight fits none."""
    slurm = SmallCluster()
    spec = job_spec(nodes=2, gpus_per_node=2)
    job = render(spec, str(runs.new_run_dir(tmp_path, "mnist")), str(ROOT))
    run = schedule(job, SlurmBackend(slurm), check=True)  # type: ignore[arg-type]
    script = (run.path / "job.sbatch").read_text()
    assert "#SBATCH --cpus-per-gpu=1\n" in script and "cpus-per-gpu=4" not in script
    assert '"--cpus-per-gpu=1"' in (run.path / "plan.json").read_text()
    assert slurm.asked == 1
    unchecked = render(spec, str(runs.new_run_dir(tmp_path, "mnist")), str(ROOT))
    run = schedule(unchecked, SlurmBackend(SmallCluster()), check=False)  # type: ignore[arg-type]
    assert "#SBATCH --cpus-per-gpu=4\n" in (run.path / "job.sbatch").read_text()


def test_the_private_submitit_method_clustertrain_uses_is_there() -> None:
    """Slurm.submit calls SlurmExecutor._submit_command(command) and overrides
    _make_submission_file_text(command, uid) and _make_submission_command(path); pyproject pins
    submitit to releases that have all three with these parameters (the end-to-end tests run
    the real path)."""
    executor = submitit.SlurmExecutor
    assert list(inspect.signature(executor._submit_command).parameters) == ["self", "command"]
    params = inspect.signature(executor._make_submission_file_text).parameters
    assert list(params) == ["self", "command", "uid"]
    params = inspect.signature(executor._make_submission_command).parameters
    assert list(params) == ["self", "submission_file_path"]

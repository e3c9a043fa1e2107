"""End to end on the real local Slurm cluster (`clustertrain cluster up`): submit, follow, status,
cancel, through the CLI as users run it. Jobs train MNIST on a small subset, so each takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from clustertrain import localcluster as local
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slurm
QUICK = ["--recipe", "fast", "--limit-train", "4000", "--batch-size", "32", "--lr", "0.05"]
QUICK += ["--epochs", "2"]
# For tests of what the job shows, not what it learns: one short epoch.
SMOKE = ["--recipe", "fast", "--limit-train", "1000", "--batch-size", "32", "--epochs", "1"]
JOB_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster() -> None:
    done = (
        subprocess.run(
            ["sinfo", "-h", "-o", "%D %t"],
            capture_output=True,
            text=True,
            env=_slurm_env(),
            check=False,
        )
        if _has_sinfo()
        else None
    )
    if done is None or done.returncode != 0 or not done.stdout.strip():
        message = (
            "no local Slurm cluster: run `clustertrain cluster up` (as root) first, and export "
            "the SLURM_CONF it prints"
        )
        if os.environ.get("CLUSTERTRAIN_REQUIRE_SLURM"):
            pytest.fail(message)
        pytest.skip(message)


def _has_sinfo() -> bool:
    return any(Path(d, "sinfo").exists() for d in os.environ.get("PATH", "").split(":"))


def _slurm_env() -> dict[str, str]:
    from clustertrain import api

    return api.slurm().environ


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERTRAIN_DATA_DIR": str(data_dir),
    }


def submit(env: dict[str, str], *args: str) -> tuple[str, Path]:
    done = run_cli("submit", *args, env=env)
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout)
    run_dir = re.search(r"run folder: (.+)", done.stdout)
    assert job_id and run_dir, done.stdout
    return job_id[1], Path(run_dir[1])


def submit_mnist(
    env: dict[str, str], job_file: str, nodes: int, gpus: int, *train_args: str
) -> tuple[str, Path]:
    """Submit a shipped MNIST job file on ``nodes`` x ``gpus``, with these training arguments."""
    return submit(
        env, job_file, "--nodes", str(nodes), "--gpus-per-node", str(gpus), "--", *train_args
    )


def follow(env: dict[str, str], job: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("logs", job, "--follow", *args, env=env, timeout=JOB_TIMEOUT_S)


def metrics(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "out" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.every_slurm
def test_torchrun_2x2_trains_and_slurm_got_the_dry_run(cluster: None, env: dict[str, str]) -> None:
    # CPUs given: a default CPU request is fitted to the partition at submission, which the dry
    # run cannot ask (docs/your-site.md); everything else must be the same.
    args = [
        "jobs/mnist.yaml",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--cpus-per-gpu",
        "1",
        "--",
        "--strategy",
        "ddp",
        *QUICK,
    ]
    dry = run_cli("submit", "--dry-run", *args, env=env)
    job_id, run_dir = submit(env, *args)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    done = metrics(run_dir)[-1]
    assert done["event"] == "done" and done["world_size"] == 4
    assert float(done["test_acc"]) > 0.8  # type: ignore[arg-type]

    received = subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"],
        capture_output=True,
        text=True,
        env=_slurm_env(),
        check=True,
    )
    dry_batch = dry.stdout.split(" (handed to sbatch)\n")[1].split("#### ")[0]
    dry_run_dir = re.search(r"CLUSTERTRAIN_RUN_DIR=(\S+)", dry_batch)
    assert dry_run_dir is not None
    assert received.stdout == dry_batch.replace(dry_run_dir[1], str(run_dir))
    for name, said in (("launch.sh", "(run by srun on every node)\n"), ("plan.json", "decides)\n")):
        shown = dry.stdout.split(said)[1].split("#### ")[0]
        assert (run_dir / name).read_text() == shown.replace(dry_run_dir[1], str(run_dir))

    status = run_cli("status", job_id, env=env)
    assert "COMPLETED" in status.stdout and "final test_acc " in status.stdout
    assert job_id in run_cli("list", env=env).stdout
    # The job file's prepare step ran here before queueing; its output is kept.
    raw = Path(env["CLUSTERTRAIN_DATA_DIR"]) / "MNIST" / "raw"
    assert (run_dir / "prepare.log").read_text() == f"{raw}\n"


def test_a_job_without_its_data_fails_at_once_in_one_line_and_fetches_nothing(
    cluster: None, env: dict[str, str], tmp_path: Path
) -> None:
    """The newcomer's old failure: with the prepare step skipped and an empty data folder, the
    job never tries the network (the nodes have no route out): rank 0 says what is missing and
    how to fetch it, once, and nothing is left in the folder."""
    empty = tmp_path / "no-data"
    env = {**env, "CLUSTERTRAIN_DATA_DIR": str(empty)}
    job_id, _ = submit(env, "jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "2",
                       "--no-prepare")  # fmt: skip
    followed = follow(env, job_id)
    assert followed.returncode != 0 and "FAILED" in followed.stderr
    said = [line for line in followed.stdout.splitlines() if "MNIST is not in" in line]
    # Rank 0, on the allocation's first node (whichever that is), once.
    assert len(said) == 1 and re.match(r"node[0-9]+ rank0 ! error: MNIST is not in", said[0]), said
    assert f"python -m jobs.mnist.data --data-dir {empty}" in said[0]
    assert "fetching" not in followed.stdout and not empty.exists()


def test_accelerate_2x2_is_one_real_4_process_run(cluster: None, env: dict[str, str]) -> None:
    job_id, run_dir = submit_mnist(
        env, "jobs/mnist-accelerate.yaml", 2, 2, "--strategy", "accelerate", *QUICK
    )
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    done = metrics(run_dir)[-1]
    assert done["world_size"] == 4 and done["strategy"] == "accelerate"


def test_4_nodes_follow_shows_every_rank(cluster: None, env: dict[str, str]) -> None:
    job_id, _ = submit_mnist(env, "jobs/mnist.yaml", 4, 0, "--strategy", "ddp", *SMOKE)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    ranks = set(re.findall(r"^node\d+ rank(\d+) ", followed.stdout, re.MULTILINE))
    assert ranks == {"0", "1", "2", "3"}, followed.stdout[-2000:]
    nodes = set(re.findall(r"^(node\d+) rank", followed.stdout, re.MULTILINE))
    assert len(nodes) == 4
    only_rank_2 = run_cli("logs", job_id, "--rank", "2", env=env).stdout.splitlines()
    assert only_rank_2 and all(" rank2 " in line for line in only_rank_2)


def test_two_jobs_at_once_on_the_same_nodes_both_complete(
    cluster: None, env: dict[str, str]
) -> None:
    both = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1"]
    both += ["--sbatch-option=--nodelist=node1,node2", "--", "--strategy", "ddp", *SMOKE]
    jobs = [submit(env, *both) for _ in range(2)]
    for job_id, run_dir in jobs:
        followed = follow(env, job_id)
        assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
        assert metrics(run_dir)[-1]["world_size"] == 2
    # Both ran on node1 and node2 at once; their rendezvous ports differ by job id.
    nodes = {re.search(r"nodes: (\S+)", run_cli("status", j, env=env).stdout)[1] for j, _ in jobs}  # type: ignore[index]
    assert len(nodes) == 1, nodes


@pytest.mark.every_slurm
def test_cancel_a_running_job(cluster: None, env: dict[str, str]) -> None:
    job_id, _ = submit_mnist(
        env, "jobs/mnist.yaml", 2, 1, "--strategy", "ddp", "--recipe", "fast", "--epochs", "50",
        "--limit-train", "4000", "--log-every", "10",
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # While it trains, status shows how far it got (from the run folder's events).
    while "progress: epoch" not in (status := run_cli("status", job_id, env=env).stdout):
        assert time.monotonic() < deadline, f"job never showed progress: {status}"
        time.sleep(1)
    assert "RUNNING" in status and re.search(r"progress: epoch \d+/50, step \d+", status), status
    cancelled = run_cli("cancel", job_id, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    followed = follow(env, job_id)
    assert followed.returncode != 0 and "CANCELLED" in followed.stderr
    assert "CANCELLED" in run_cli("status", job_id, env=env).stdout


@pytest.mark.every_slurm
def test_a_failing_job_reports_failed_and_the_rank_error(
    cluster: None, env: dict[str, str]
) -> None:
    job_id, _ = submit_mnist(env, "jobs/mnist.yaml", 2, 1, "--strategy", "no-such-strategy")
    followed = follow(env, job_id)
    assert followed.returncode != 0 and "FAILED" in followed.stderr
    assert "FAILED" in run_cli("status", job_id, env=env).stdout
    errors = run_cli("logs", job_id, "--errors", env=env).stdout
    assert re.search(r"rank\d+ ! .*no-such-strategy", errors), errors[-2000:]


def test_submit_without_a_reachable_slurm_is_one_line(tmp_path: Path) -> None:
    done = run_cli(
        "submit",
        "--nodes",
        "1",
        env={
            "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
            "PATH": "/usr/bin:/bin",
            "SLURM_CONF": str(tmp_path / "missing.conf"),
        },
        cwd=ROOT,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--nodes", "5", "--cpus-per-task", "1"], "nodes: 5 requested but partition debug has"),
        (["--gpus-per-node", "3"], "gpus_per_node: 3 GPUs per node"),
        (["--cpus-per-task", "64"], "cpus_per_task: 64 CPUs"),
        (["--partition", "gpu"], "partition: 'gpu' does not exist"),
    ],
)
@pytest.mark.every_slurm
def test_preflight_refuses_what_the_partition_cannot_run(
    cluster: None, env: dict[str, str], flags: list[str], names: str
) -> None:
    done = run_cli("submit", *flags, env=env)
    assert done.returncode == 2 and done.stderr.startswith(f"clustertrain: error: {names}")
    assert not Path(env["CLUSTERTRAIN_RUNS_DIR"]).exists()


def test_no_preflight_queues_it_anyway(cluster: None, env: dict[str, str]) -> None:
    job_id, _ = submit(env, "--nodes", "5", "--no-preflight")
    try:
        # What preflight spares users: Slurm takes the job and leaves it pending for good.
        status = run_cli("status", job_id, env=env).stdout
        assert "PENDING" in status and "reason: Partition" in status, status
    finally:
        assert run_cli("cancel", job_id, env=env).returncode == 0


@pytest.mark.every_slurm
def test_doctor_describes_the_cluster(cluster: None, env: dict[str, str]) -> None:
    done = run_cli("doctor", env=env)
    assert "partition debug (default): UP, 4/4 nodes usable" in done.stdout, done.stdout
    layout = local.current_layout(local.default_state_dir())
    kept = "available" if layout and layout.accounting else "unavailable"
    assert f"accounting (sacct): {kept}" in done.stdout, done.stdout

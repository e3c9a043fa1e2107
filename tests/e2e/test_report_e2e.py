"""``clustertrain report`` on the local cluster with its accounting (slurmdbd; slurm.conf's
``AccountingStorageTRES=gres/gpu``): the demo MNIST job and a job healed by a spare, each
reported from sacct (queue wait, GPU-hours, goodput and its badput buckets) and from its run
folder alone, with sacct hidden (a ``sacct`` first on PATH that says accounting is disabled,
as a cluster without slurmdbd answers)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from clustertrain import api
from clustertrain import localcluster as local
from clustertrain.runs.cost import COLUMNS
from tests.conftest import run_cli
from tests.e2e.test_node_failure_e2e import _second_node
from tests.e2e.test_preemption import RUN_TIMEOUT_S, SLURM_ARGS, _attempt_log, _wait
from tests.e2e.test_slurm_e2e import QUICK, cluster, follow, submit  # noqa: F401  (a fixture)
from tests.e2e.test_spare_nodes_e2e import site_cluster  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slurm
BUCKETS = ("node check", "start-up", "checkpoint save", "restarts", "lost progress", "other")
DEMO = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--cpus-per-gpu", "1",
        "--", "--strategy", "ddp", *QUICK]  # fmt: skip
# --no-qualify: the spare heals a lost node here; spare nodes would turn qualification on, and
# its seconds would land in the "node check" bucket this test does not look at.
SPARE = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--spare-nodes", "1",
         "--no-qualify"]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


@pytest.fixture
def accounted(cluster: None) -> None:  # noqa: F811
    found = local.current_layout(local.default_state_dir())
    assert found is not None
    if not found.accounting:
        pytest.skip("the local cluster runs without accounting (cluster up --no-accounting)")


def hidden(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``env`` with a sacct first on PATH that answers as Slurm without slurmdbd does."""
    bin_dir = tmp_path / "no-accounting"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sacct"
    fake.write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\n"
                    "exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def report(env: dict[str, str], *args: str) -> str:
    done = run_cli("report", *args, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def check_from_sacct(env: dict[str, str], job_id: str, gpus: int) -> dict[str, str]:
    """The job's report from accounting: every figure there, GPU-hours from AllocTRES."""
    text = report(env, job_id)
    lines = text.splitlines()
    assert lines[0].startswith(f"job {job_id} (") and "(figures from sacct)" in lines[0], text
    assert any(line.startswith("  queue wait   ") for line in lines), text
    assert any(line.startswith("  GPU-hours    ") and f"({gpus} GPUs)" in line for line in lines)
    assert any(line.startswith("  goodput      ") for line in lines), text
    assert "  badput:" in lines and all(f"    {bucket} " in text for bucket in BUCKETS), text
    assert "not known" not in text and "unreadable" not in text, text
    (row,) = csv.DictReader(io.StringIO(report(env, job_id, "--format", "csv")))
    assert tuple(row) == COLUMNS and row["source"] == "sacct" and row["gpus"] == str(gpus)
    allocated = float(row["allocated_s"])
    # Each of the job's records at its size (a job that lost a node is resized, and Slurm
    # accounts each size apart: sacct --duplicates), summed: never more than all of it at most.
    assert 0 < float(row["gpu_hours"]) <= allocated * gpus / 3600 * 1.001
    assert 0.0 < float(row["goodput"]) < 1.0
    assert float(row["productive_s"]) > 0 and float(row["queue_wait_s"]) >= 0
    return row


def check_from_the_run_folder(env: dict[str, str], job_id: str, tmp_path: Path) -> dict[str, Any]:
    """The same job's report with accounting hidden: the run folder's figures, each one only
    accounting knows said in a line."""
    blind = hidden(env, tmp_path)
    text = report(blind, job_id)
    assert "(figures from run folder)" in text.splitlines()[0], text
    assert "  queue wait   " in text and "  goodput      " in text and "  badput:" in text, text
    assert "GPU-hours: not known (no accounting: sacct answered nothing" in text, text
    assert "; from the run folder: " in text and "process-hours" in text, text
    (row,) = json.loads(report(blind, job_id, "--format", "json"))
    assert row["source"] == "run folder" and row["gpu_hours"] is None
    assert row["folder_process_hours"] > 0 and 0.0 < row["goodput"] < 1.0
    return row


@pytest.mark.every_slurm
def test_the_demo_jobs_report_from_sacct_and_from_its_run_folder_alone(
    accounted: None, env: dict[str, str], tmp_path: Path
) -> None:
    job_id, _ = submit(env, *DEMO)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    sacct = check_from_sacct(env, job_id, gpus=2)
    assert (sacct["attempts"], sacct["restarts"]) == ("1", "0")
    assert float(sacct["badput_restarts_s"]) == 0.0 and float(sacct["badput_lost_s"]) == 0.0
    folder = check_from_the_run_folder(env, job_id, tmp_path)
    # The run folder sees less of the allocation than sacct: never more.
    assert folder["wall_s"] <= float(sacct["wall_s"]) + 1.0
    assert folder["productive_s"] == pytest.approx(float(sacct["productive_s"]))


@pytest.mark.slow
def test_a_job_healed_by_a_spare_reports_its_restart_and_the_progress_it_lost(
    site_cluster: local.Layout,  # noqa: F811
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    if not site_cluster.accounting:
        pytest.skip("the local cluster runs without accounting (cluster up --no-accounting)")
    job_id, run_dir = submit(env, *SPARE, "--", *SLURM_ARGS)
    node = _second_node(job_id)
    assert api.slurm().state(job_id).nodes == "node[1-3]"
    _wait("epoch 2", lambda: "epoch 2/3 step 20/" in _attempt_log(run_dir, 0), 240)
    assert run_cli("cluster", "fail", node).returncode == 0
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    # Three nodes allocated (one a spare), a GPU each: GPU-hours count the spare too.
    sacct = check_from_sacct(env, job_id, gpus=3)
    assert (sacct["attempts"], sacct["restarts"]) == ("1", "1")
    # The step stopped after epoch 1's checkpoint: training since then was lost, and the
    # spare took time to start again.
    assert float(sacct["badput_restarts_s"]) > 0 and float(sacct["badput_lost_s"]) > 0
    assert float(sacct["badput_restore_s"]) > 0  # the restarted step resumed from it
    text = report(env, job_id)
    assert "1 restart (figures from sacct)" in text.splitlines()[0], text
    folder = check_from_the_run_folder(env, job_id, tmp_path)
    assert folder["restarts"] == 1 and folder["badput_restarts_s"] > 0

"""A node lost mid-job with a spare in the allocation, on the local cluster with Slurm's verdict
on a silent node as slow as at a real site (SlurmdTimeout=300): the batch script's roll call
finds the node, the step starts again on the healthy node and the spare from the last
checkpoint, and the job ends COMPLETED without a requeue, as an uninterrupted run would."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import api, protocol
from clustertrain import localcluster as local
from tests.conftest import run_cli
from tests.e2e.test_node_failure_e2e import _second_node, restarted_with
from tests.e2e.test_preemption import (
    RUN_TIMEOUT_S,
    SLURM_ARGS,
    _assert_same_run,
    _attempt_log,
    _wait,
)
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SITE_SLURMD_TIMEOUT_S = 300
# --no-qualify: these tests are about a lost node and the roll call, and spare nodes would turn
# qualification on (docs/qualification.md): its seconds before each step are not what they time.
JOB = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--spare-nodes", "1",
       "--no-qualify"]  # fmt: skip


@pytest.fixture
def site_cluster(cluster: None) -> Iterator[local.Layout]:  # noqa: F811
    yield from restarted_with(SITE_SLURMD_TIMEOUT_S)


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


@pytest.mark.every_slurm
def test_a_lost_node_is_replaced_by_a_spare_without_a_requeue_and_the_run_is_unchanged(
    site_cluster: local.Layout, env: dict[str, str], uninterrupted_mnist: Path
) -> None:
    job_id, run_dir = submit(env, *JOB, "--", *SLURM_ARGS)
    node = _second_node(job_id)
    assert api.slurm().state(job_id).nodes == "node[1-3]"
    # Lost after epoch 1's checkpoint, in the middle of epoch 2.
    _wait("epoch 2", lambda: "epoch 2/3 step 20/" in _attempt_log(run_dir, 0), 240)
    assert run_cli("cluster", "fail", node).returncode == 0
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    assert "ended COMPLETED" in followed.stderr
    assert f"{node} is lost: it did not answer the roll call" in followed.stdout
    assert f"lost {node}; starting the step again on node1,node3" in followed.stdout

    # One attempt: no requeue. The spare trained in it, from epoch 1's checkpoint.
    logs = run_dir / protocol.LOGS_DIR
    assert [p.name for p in logs.glob(f"{protocol.ATTEMPT_DIR}*")] == [f"{protocol.ATTEMPT_DIR}0"]
    assert "resuming at epoch 2 from " in _attempt_log(run_dir, 0)
    assert re.search(r"\[rank1\]: .* on node3", (logs / "attempt-0" / "node3.out").read_text())
    lost = logs / "attempt-0" / f"{protocol.HEARTBEAT_DIR}-lost-1" / protocol.LOST_FILE
    assert lost.read_text() == f"{node}\n"
    seen = [json.loads(line) for line in (run_dir / protocol.EVENTS_FILE).read_text().splitlines()]
    assert sorted(e["epoch"] for e in seen if e["event"] == "epoch") == [1, 2, 3]
    assert [e["event"] for e in seen if e["event"] in ("node_lost", "restarted", "requeued")] == [
        "node_lost",
        "restarted",
    ]

    status = run_cli("status", job_id, env=env).stdout
    assert "COMPLETED" in status and "restarts: 0" in status, status
    assert not _left_behind(run_dir), "a node's beacon outlived its launcher"
    assert f"step restarted in attempt 0 after {node} lost: training again " in status, status
    _assert_same_run(run_dir / "out", uninterrupted_mnist)


def _left_behind(run_dir: Path) -> list[str]:
    """Processes still running the job's launch script (every node's beacon is one), a few
    seconds after the job ended."""
    time.sleep(2 * protocol.BEACON_S)
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir / "launch.sh").encode() in argv:
            found.append(proc.name)
    return found


def test_with_no_spare_left_the_job_ends_naming_the_lost_nodes(
    site_cluster: local.Layout, env: dict[str, str]
) -> None:
    """The spare is lost first, unseen (it runs nothing); when a training node follows, the
    spare's own roll call finds it gone and the job ends at once, keeping its checkpoint."""
    job_id, run_dir = submit(env, *JOB, "--", *SLURM_ARGS)
    node = _second_node(job_id)
    _wait("epoch 1", lambda: "epoch 1/3 step 20/" in _attempt_log(run_dir, 0), 240)
    assert run_cli("cluster", "fail", "node3").returncode == 0  # the spare
    assert run_cli("cluster", "fail", node).returncode == 0
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode != 0
    assert "ended FAILED" in followed.stderr, followed.stdout[-3000:] + followed.stderr
    said = followed.stdout + followed.stderr
    assert "spare node3 is lost too" in said
    assert f"lost {node} and no spare node is left: the job ends here" in said
    assert api.slurm().state(job_id).exit_code == "5:0"
    assert not _left_behind(run_dir), "a node's beacon outlived its launcher"

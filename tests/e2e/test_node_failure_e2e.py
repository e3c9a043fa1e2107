"""A node that disappears mid-job, on the local cluster's namespace layout (`clustertrain
cluster fail`): the job ends naming the node, or, with `requeue_on_node_failure`, is requeued
on other nodes and resumes from its last checkpoint, ending as an uninterrupted run would."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import api
from clustertrain import localcluster as local
from tests.conftest import run_cli
from tests.e2e.test_preemption import (
    RUN_TIMEOUT_S,
    SLURM_ARGS,
    _assert_same_run,
    _attempt_log,
    _wait,
    release_requeued,
)
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
JOB = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--", *SLURM_ARGS]


# Slurm's verdict on a silent node is what these tests wait for: they run with the shortest
# SlurmdTimeout the local cluster takes (its default, 30 s, is for every other test).
QUICK_SLURMD_TIMEOUT_S = 10


def restarted_with(slurmd_timeout_s: int) -> Iterator[local.Layout]:
    """The shared cluster started afresh with this SlurmdTimeout (Slurm's verdict on a silent
    node), and again as it was after the test, which fails one of its nodes."""
    found = local.current_layout(local.default_state_dir())
    assert found is not None
    if found.network != "namespaces":
        pytest.skip("needs the namespace layout, where a node is a host of its own")
    local.down(found.state_dir)
    local.up(dataclasses.replace(found, slurmd_timeout_s=slurmd_timeout_s))
    yield found
    local.down(found.state_dir)
    local.up(found)


@pytest.fixture
def layout(cluster: None) -> Iterator[local.Layout]:  # noqa: F811
    yield from restarted_with(QUICK_SLURMD_TIMEOUT_S)


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


def _second_node(job_id: str) -> str:
    """The job's non-head node: the batch shell runs on the head and must survive."""
    _wait(f"job {job_id} running", lambda: api.slurm().state(job_id).state == "RUNNING")
    from clustertrain.env import expand_hostlist

    return expand_hostlist(api.slurm().state(job_id).nodes)[1]


# A cut link: the node's processes live on, unreachable. A killed node's way to NODE_FAIL is
# the requeue test's below (and the spare tests' roll call finds killed nodes).
@pytest.mark.parametrize("how", [["--cut-link"]], ids=["link-cut"])
@pytest.mark.every_slurm
def test_a_lost_node_ends_the_job_and_status_names_it(
    layout: local.Layout, env: dict[str, str], how: list[str]
) -> None:
    job_id, run_dir = submit(env, *JOB)
    node = _second_node(job_id)
    _wait("training", lambda: "epoch 1/3 step 20/" in _attempt_log(run_dir, 0))
    failed = run_cli("cluster", "fail", node, *how)
    assert failed.returncode == 0, failed.stderr
    # srun waits for Slurm's verdict on the node (SlurmdTimeout), then the job ends NODE_FAIL,
    # not requeued: it was submitted --no-requeue.
    ended = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert "ended NODE_FAIL" in ended.stderr, ended.stdout[-3000:] + ended.stderr
    lost = f"{node} lost: Slurm declared it down and ended the job (NODE_FAIL)"
    assert lost in ended.stderr, ended.stderr
    status = run_cli("status", job_id, env=env).stdout
    # The cause's headline (clustertrain.runs.why), which the lost-node line no longer repeats.
    assert lost in status and "restarts: 0" in status, status
    # srun says "Node failure on" only if slurmctld's message reaches it before the same pass
    # of slurmctld stops it (a CI run once printed none): the headline must not depend on it.
    # Without those lines, Slurm's accounting (its node events) still names the node.
    _forget_srun_words(run_dir, job_id)
    untold = run_cli("status", job_id, env=env).stdout
    assert lost in untold, untold


def _forget_srun_words(run_dir: Path, job_id: str) -> None:
    """The batch log as if srun had never been told of the lost node."""
    batch = run_dir / "logs" / f"slurm-{job_id}.err"
    said = batch.read_text()
    batch.write_text("".join(ln for ln in said.splitlines(True) if "Node failure on" not in ln))


def test_with_requeue_on_node_failure_it_resumes_elsewhere_and_matches_an_uninterrupted_run(
    layout: local.Layout, env: dict[str, str], uninterrupted_mnist: Path
) -> None:
    job_id, run_dir = submit(env, "--requeue-on-node-failure", *JOB)
    node = _second_node(job_id)
    # Lost after epoch 1's checkpoint, in the middle of epoch 2.
    _wait("epoch 2", lambda: "epoch 2/3 step 20/" in _attempt_log(run_dir, 0), 240)
    assert run_cli("cluster", "fail", node).returncode == 0
    release_requeued(job_id, restarts=1)
    followed = run_cli("logs", job_id, "--follow", env=env, timeout=RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    second = {p.stem for p in (run_dir / "logs" / "attempt-1").glob("node*.out")}
    assert len(second) == 2 and node not in second, second
    # From epoch 1's checkpoint: epoch 2 runs again from its start, and is recorded once.
    assert re.search(r"resuming at epoch 2 from ", _attempt_log(run_dir, 1))
    status = run_cli("status", job_id, env=env).stdout
    assert "COMPLETED" in status and "restarts: 1" in status, status
    lost = f"lost node(s): {node} (Slurm declared them down; in an earlier attempt)"
    assert lost in status, status
    _forget_srun_words(run_dir, job_id)  # accounting still says which (see the test above)
    untold = run_cli("status", job_id, env=env).stdout
    assert lost in untold, untold
    _assert_same_run(run_dir / "out", uninterrupted_mnist)

"""Qualification on the local cluster, with faults made for real (`cluster degrade`: a tbf
queue on a node's link, a CPU quota on its processes): a 2-node job with one spare never trains
on the node whose link is slow, `status` names it with its figure, the next submission's dry run
excludes it and says why; with node2's CPU at 25 % mid-training, the watchdog names it a
straggler (bench/qualify.py has the time it takes: about 20 s); `cluster heal` leaves no queue
discipline or cgroup behind."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clustertrain import protocol
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import SMOKE, cluster, follow, submit  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slurm
# Node3 among the job's three nodes, and not its first (the head node runs the supervisor).
# No --qualify: the spare turns qualification on (the job, which trained on node3).
JOB = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--spare-nodes", "1",
       "--sbatch-option=--nodelist=node1,node2,node3"]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "CLUSTERTRAIN_DATA_DIR": str(data_dir)}


def _degraded(node: str, *how: str) -> Iterator[None]:
    done = run_cli("cluster", "degrade", node, *how)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        healed = run_cli("cluster", "heal", node)
        assert healed.returncode == 0, healed.stderr
        assert _left(), "heal left a queue discipline or a cgroup"


def _left() -> bool:
    """Whether no tbf queue and no slow cgroup of the local cluster is left."""
    shown = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True)
    groups = [*Path("/sys/fs/cgroup/cpu").glob("clustertrain-*-slow"),
              *Path("/sys/fs/cgroup").glob("clustertrain-*-slow")]  # fmt: skip
    return " tbf " not in shown.stdout and not groups


@pytest.fixture
def slow_link(cluster: None) -> Iterator[None]:  # noqa: F811
    yield from _degraded("node3", "--link-rate", "10mbit")


def test_a_node_with_a_slow_link_is_swapped_for_the_spare_named_and_then_excluded(
    slow_link: None, env: dict[str, str]
) -> None:
    job_id, run_dir = submit(env, *JOB, "--", *SMOKE)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    assert "qualification flagged node3: link " in followed.stdout
    assert "training on node1,node2 instead (node3 left out)" in followed.stdout
    attempt = run_dir / protocol.LOGS_DIR / f"{protocol.ATTEMPT_DIR}0"
    assert sorted(p.name for p in attempt.glob("*.out")) == ["node1.out", "node2.out"]
    probes = {p.stem: json.loads(p.read_text()) for p in (attempt / "node-check").glob("*.json")}
    slowest = min(probes, key=lambda node: probes[node]["link_mib_s"])
    assert slowest == "node3" and sorted(probes) == ["node1", "node2", "node3"]

    status = run_cli("status", job_id, env=env).stdout
    assert "qualified: node1 node2 node3 (attempt 0, 1 flagged)" in status, status
    assert "flagged: node3: link " in status and "slower than the median" in status, status

    # The next submission from the same runs root keeps off node3, and says why.
    again = run_cli("submit", "jobs/mnist.yaml", "--nodes", "2", "--dry-run", env=env)
    assert "#SBATCH --exclude=node3\n" in again.stdout, again.stdout[:2000]
    assert "node3: flagged: link " in again.stdout and f"(job {job_id}; until " in again.stdout
    listed = run_cli("nodes", env=env)
    assert listed.stdout.startswith("node3: flagged: link "), listed.stdout


def test_a_cpu_quota_slows_the_nodes_processes_and_heal_removes_it(cluster: None) -> None:  # noqa: F811
    gen = _degraded("node2", "--cpu", "25%")
    next(gen)
    groups = [*Path("/sys/fs/cgroup/cpu").glob("clustertrain-*-node2-slow")]
    assert groups and (groups[0] / "cgroup.procs").read_text().split()  # slurmd at least
    assert (groups[0] / "cpu.cfs_quota_us").read_text().strip() == "25000"
    with pytest.raises(StopIteration):
        next(gen)


def test_a_node_slowed_mid_training_is_named_a_straggler_within_a_minute(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    """node2's CPU at 25 % in the middle of a 2-node MNIST run: `status` names node2."""
    job_id, run_dir = submit(
        env, "jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1",
        "--sbatch-option=--nodelist=node1,node2", "--", "--recipe", "fast", "--epochs", "3",
    )  # fmt: skip
    events_file = run_dir / protocol.EVENTS_FILE
    _wait_for(lambda: '"step"' in _text(events_file), 240, "the first logged step")
    time.sleep(5)  # a few seconds of healthy steps: the scores' window
    slowed = time.time()
    gen = _degraded("node2", "--cpu", "25%")
    next(gen)
    try:
        _wait_for(lambda: '"straggler"' in _text(events_file), 120, "a straggler event")
        named_after = time.time() - slowed
        status = run_cli("status", job_id, env=env).stdout
        assert "straggler: node2 (rank 1) at " in status, status
        print(f"straggler named {named_after:.1f} s after node2 slowed down")
    finally:
        run_cli("cancel", job_id, env=env)
        with pytest.raises(StopIteration):
            next(gen)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        time.sleep(1)


def test_with_replace_a_straggler_is_swapped_for_the_spare_at_the_next_checkpoint(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    """node2's CPU at 25 % mid-training, `straggler_action: replace`, node3 a spare: once named,
    node2 is let go at the next epoch's checkpoint, the step goes on from there on node1 and
    node3 (no requeue), and the job completes."""
    job_id, run_dir = submit(
        env, "jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1", "--spare-nodes", "1",
        "--no-qualify",  # stragglers while training: qualifying first would only add time
        "--straggler-action", "replace", "--sbatch-option=--nodelist=node1,node2,node3", "--",
        "--recipe", "fast", "--limit-train", "4000", "--batch-size", "32", "--epochs", "8",
    )  # fmt: skip
    events_file = run_dir / protocol.EVENTS_FILE
    _wait_for(lambda: '"step"' in _text(events_file), 240, "the first logged step")
    gen = _degraded("node2", "--cpu", "25%")
    next(gen)
    try:
        _wait_for(lambda: '"restarted"' in _text(events_file), 180, "the straggler's replacement")
    finally:
        with pytest.raises(StopIteration):
            next(gen)
    followed = follow(env, job_id)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    seen = [json.loads(line) for line in events_file.read_text().splitlines()]
    order = [(e["event"], e.get("nodes") or e.get("why")) for e in seen
             if e["event"] in ("straggler", "restarted", "requeued", "ended")]  # fmt: skip
    assert order == [("straggler", "node2"), ("restarted", "node_lost"), ("ended", None)], order
    assert seen[-1]["status"] == "0"
    node3 = (run_dir / "logs" / "attempt-0" / "node3.out").read_text()
    assert "rank1" in node3, node3[-2000:]  # the spare trained, from the checkpoint on
    assert "straggler: node2 (rank 1) at " in run_cli("status", job_id, env=env).stdout

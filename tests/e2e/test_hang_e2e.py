"""A hung rank is found on the real cluster: the step is ended, every rank's stack is in the run
folder, and status names where each group of ranks waits (clustertrain.node.watchdog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain import protocol
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, follow, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
SCRIPT = "tests/jobs/hang_rank.py"
QUIET = "tests/jobs/quiet_hang.py"


def _line(text: str) -> int:
    lines = Path(SCRIPT).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


@pytest.mark.every_slurm
def test_a_hung_step_starts_again_on_the_same_nodes_and_completes(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    """With max_restarts, the hung step is started again inside the allocation: no requeue."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env, "--script", SCRIPT, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "2",
        "--hang-timeout", "10", "--max-restarts", "1",
    )  # fmt: skip
    followed = follow(env, job_id)
    assert followed.returncode == 0 and "COMPLETED" in followed.stderr, followed.stdout[-2000:]
    assert "starting it again on the same nodes (restart 1 of at most 1)" in followed.stdout
    status = run_cli("status", job_id, env=env).stdout
    assert "restarts: 0" in status  # Slurm's: it never went back to the queue
    assert "step restarted in attempt 0 after a hang: training again " in status, status
    hung = run_dir / "logs" / "attempt-0" / f"{protocol.HEARTBEAT_DIR}-hung-1"
    said = (hung / protocol.HANG_FILE).read_text()
    # The hung step named: every group of ranks by where it waits, from every rank's stack.
    assert said.startswith("hang at step 29: no rank made progress for"), said
    waiting = f"ranks 0, 2-3 in all_reduce (hang_rank.py:{_line('dist.all_reduce(value)')})"
    assert waiting in said and f"rank 1 in <module> (hang_rank.py:{_line('time.sleep(3600)')})" in (
        said
    ), said
    for rank in range(4):
        assert "(most recent call first)" in (hung / f"rank-{rank}.stack").read_text()


def test_a_crashed_rank_restarts_the_step_on_the_same_nodes_and_completes(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Rank 1 raises at step 30, once: with max_restarts the batch script starts the whole step
    again with a fresh rendezvous (torchrun's own restart of its workers did not reconnect gloo
    across nodes here: the other node's new ranks found the old addresses)."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env, "--script", "tests/jobs/crash_once.py", "--nodes", "2", "--procs-per-node", "2",
        "--cpus-per-task", "2", "--max-restarts", "1",
    )  # fmt: skip
    followed = follow(env, job_id)
    assert followed.returncode == 0 and "COMPLETED" in followed.stderr, followed.stdout[-2000:]
    assert "the step failed (exit status " in followed.stdout
    assert "RuntimeError: rank 1 crashed at step 30" in followed.stdout + followed.stderr
    status = run_cli("status", job_id, env=env).stdout
    assert "restarts: 0" in status and "after a crash: training again " in status, status
    assert (run_dir / "logs" / "attempt-0" / f"{protocol.HEARTBEAT_DIR}-failed-1").is_dir()


def test_a_plain_scripts_hang_is_found_from_its_quiet_output_with_py_spys_stacks(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Without the runtime library, only if the user opts in (hang_on_quiet); py-spy takes the
    stacks on every node, and the summary says so."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    job_id, run_dir = submit(
        env, "--script", QUIET, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "2",
        "--hang-timeout", "10", "--hang-on-quiet",
    )  # fmt: skip
    followed = follow(env, job_id)
    assert followed.returncode != 0 and "FAILED" in followed.stderr, followed.stdout[-2000:]
    status = run_cli("status", job_id, env=env).stdout
    lines = Path(QUIET).read_text().splitlines()
    sleep = next(n for n, line in enumerate(lines, 1) if "time.sleep(3600)" in line)
    reduce = next(n for n, line in enumerate(lines, 1) if "dist.all_reduce(value)" in line)
    assert "hang: no rank made progress for" in status, status
    assert f"rank 1 in <module> (quiet_hang.py:{sleep})" in status, status
    assert f"ranks 0, 2-3 in all_reduce (quiet_hang.py:{reduce})" in status, status
    assert "(stacks by py-spy for ranks 0-3)" in status, status
    beats = run_dir / "logs" / "attempt-0" / protocol.HEARTBEAT_DIR
    assert (beats / "rank-2.stack").read_text().startswith("Process ")

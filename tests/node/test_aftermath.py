"""What a run of the step left besides its status, as the supervisor reads it
(clustertrain.node.aftermath): the checkpoints it recorded, and a rank's exit with
protocol.NO_RESTART_EXIT in its launcher's report; each with the supervisor under a fake Slurm
(tests/node/test_supervisor.py's Job)."""

from __future__ import annotations

from pathlib import Path

from clustertrain import protocol
from clustertrain.node import aftermath, policy
from clustertrain.rank import events
from tests.node.test_supervisor import Job, Run, crash, ok

# The end of torchrun's failure report for rank 3, which exited NO_RESTART_EXIT.
REPORT = f"""\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
  <NO_OTHER_FAILURES>
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_21:30:00
  host      : node2
  rank      : 3 (local_rank: 1)
  exitcode  : {protocol.NO_RESTART_EXIT} (pid: 4242)
  error_file: <N/A>
"""


def checkpoint_then_crash(step: int) -> Run:
    def run(env: dict[str, str]) -> int:
        events.append(Path(env[protocol.ENV_EVENTS_FILE]), "checkpoint", 0, epoch=2, step=step)
        return crash(env)

    return run


def asks_not_to_restart(env: dict[str, str]) -> int:
    with open(Path(env["LOG_DIR"], "node2.err"), "a") as log:
        log.write("[rank3]: error: no data in /data/train\n" + REPORT)
    return 1  # srun's: torchrun exits 1 whatever its ranks' codes


def test_restarts_that_never_get_past_the_checkpoint_stop_in_a_restart_storm(
    tmp_path: Path,
) -> None:
    runs = [checkpoint_then_crash(40), crash, crash, crash, ok]
    job = Job(tmp_path, runs, max_restarts=10, storm_restarts=3)
    assert job.run() == policy.Exit.RESTART_STORM
    assert len(job.steps()) == 4
    assert [name for name, _ in job.events][-3:] == ["restarted", "restart_storm", "ended"]
    assert job.events[-2] == ("restart_storm", {"why": "step 40 of epoch 2", "restarts": 3})
    assert job.events[-1] == ("ended", {"status": str(policy.Exit.RESTART_STORM)})
    assert "restart storm: 3 restarts never got past step 40 of epoch 2 (the last checkpoint)" in (
        job.err.getvalue()
    )


def test_an_earlier_attempts_checkpoint_is_where_the_restarts_began(tmp_path: Path) -> None:
    events.append(tmp_path / "events.jsonl", "checkpoint", 0, step=120)
    job = Job(tmp_path, [crash] * 4, attempt=1, max_restarts=10, storm_restarts=3)
    assert job.run() == policy.Exit.RESTART_STORM
    assert len(job.steps()) == 4  # the attempt's first run is no restart: three more were
    assert job.events[-2] == ("restart_storm", {"why": "step 120", "restarts": 3})


def test_a_job_that_records_no_checkpoint_is_bounded_by_max_restarts_alone(tmp_path: Path) -> None:
    job = Job(tmp_path, [crash] * 6, max_restarts=5, storm_restarts=2)
    assert job.run() == 7
    assert len(job.steps()) == 6


def test_a_rank_that_exits_no_restart_ends_the_job_at_once(tmp_path: Path) -> None:
    job = Job(tmp_path, [asks_not_to_restart, ok], max_restarts=3)
    assert job.run() == protocol.NO_RESTART_EXIT
    assert len(job.steps()) == 1
    assert job.events[-2:] == [
        ("no_restart", {"nodes": "node2", "rank": 3}),
        ("ended", {"status": str(protocol.NO_RESTART_EXIT)}),
    ]
    assert "rank 3 on node2 asked not to be restarted (exit 79)" in job.err.getvalue()


def test_only_what_this_run_wrote_counts(tmp_path: Path) -> None:
    old, new = tmp_path / "node1.err", tmp_path / "node2.err"
    old.write_text(REPORT)  # an earlier run's, before the offsets were taken
    before = aftermath.node_logs(tmp_path)
    assert aftermath.no_restart(tmp_path, before) is None
    new.write_text(REPORT.replace("rank      : 3", "rank      : 5"))  # begun since: from 0
    assert aftermath.no_restart(tmp_path, before) == (5, "node2")
    path = tmp_path / "events.jsonl"
    events.append(path, "checkpoint", 0, step=1)
    start = aftermath.size(path)
    events.append(path, "metrics", 0, step=2, loss=0.5)
    events.append(path, "checkpoint", 0, epoch=3)
    assert [aftermath.where(e) for e in aftermath.checkpoints(path, start)] == ["epoch 3"]
    assert [aftermath.where(e) for e in aftermath.checkpoints(path, 0)] == ["step 1", "epoch 3"]

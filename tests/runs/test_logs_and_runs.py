"""Run folders and rank logs: finding jobs safely, prefixing lines, following to the end."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.errors import UserError
from clustertrain.jobstate import JobState
from clustertrain.render import render
from clustertrain.runs import follow, logs, why
from clustertrain.runs.inotify import Watcher
from tests.conftest import job_spec


def _make_run(root: Path, job_id: str, name: str = "mnist") -> runs.Run:
    """A recorded run: a local run's for a ``local-N`` id, else a Slurm job's."""
    job = render(job_spec(name=name, nodes=2), str(runs.new_run_dir(root, name)), "/w")
    runs.write_run_files(job)
    return runs.record_submission(job, job_id, "local" if "local" in job_id else "slurm")


def test_find_by_id_last_and_folder(tmp_path: Path) -> None:
    first = _make_run(tmp_path, "1")
    second = _make_run(tmp_path, "2")
    assert runs.find_run(tmp_path, "1") == first
    assert runs.find_run(tmp_path, "last").job_id in {"1", "2"}
    assert runs.find_run(tmp_path, second.path.name) == second
    assert runs.find_run(tmp_path, str(second.path)) == second


@pytest.mark.parametrize("ref", ["../../etc", "/etc", "../", "1; rm -rf /", "-1", "", "x" * 5000])
def test_crafted_references_do_not_escape_the_runs_root(tmp_path: Path, ref: str) -> None:
    _make_run(tmp_path / "runs", "1")
    with pytest.raises(UserError):
        runs.find_run(tmp_path / "runs", ref)


def test_a_symlinked_run_folder_is_ignored(tmp_path: Path) -> None:
    real = _make_run(tmp_path / "elsewhere", "9")
    (tmp_path / "runs").mkdir()
    os.symlink(real.path, tmp_path / "runs" / real.path.name)
    with pytest.raises(UserError):
        runs.find_run(tmp_path / "runs", "9")


def test_logs_are_prefixed_and_ordered_by_attempt(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "3")
    (run.logs_dir / "slurm-3.out").write_text("batch says hi\n")
    for attempt, node, text in (
        (1, "node2", "[rank1]: late\n"),
        (0, "node1", "[rank0]: epoch 1\nagent line\n"),
    ):
        folder = run.logs_dir / f"attempt-{attempt}"
        folder.mkdir(exist_ok=True)
        (folder / f"{node}.out").write_text(text)
    (run.logs_dir / "attempt-0" / "node1.err").write_text("[rank0]: oops\n")
    lines = list(logs.read_all(run, logs.Filter()))
    assert lines == [
        "batch | batch says hi",
        "node1 rank0 | epoch 1",
        "node1 launcher | agent line",
        "node1 rank0 ! oops",
        "node2 rank1 | late",
    ]
    assert list(logs.read_all(run, logs.Filter(rank=1))) == ["node2 rank1 | late"]
    assert list(logs.read_all(run, logs.Filter(errors=True))) == ["node1 rank0 ! oops"]
    assert list(logs.read_all(run, logs.Filter(node="node2"))) == ["node2 rank1 | late"]


def test_symlinked_logs_are_not_followed(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "4")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not show\n")
    (run.logs_dir / "attempt-0").mkdir()
    os.symlink(secret, run.logs_dir / "attempt-0" / "node1.out")
    os.symlink(secret, run.logs_dir / "slurm-4.out")
    assert list(logs.read_all(run, logs.Filter())) == []


def test_a_symlinked_logs_folder_is_not_followed(tmp_path: Path, watcher: Watcher | None) -> None:
    run = _make_run(tmp_path / "runs", "4")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "attempt-0").mkdir(parents=True)
    (elsewhere / "attempt-0" / "node1.out").write_text("do not show\n")
    (elsewhere / "slurm-4.out").write_text("do not show\n")
    run.logs_dir.rmdir()
    run.logs_dir.symlink_to(elsewhere)
    now = [0.0]
    tail = follow.Tail(run.logs_dir, "4", lambda log: True, lambda: now[0], watcher=watcher)
    assert list(tail.poll()) == [] and list(tail.finish()) == []


def test_follow_prints_lines_as_written_and_returns_the_final_state(
    tmp_path: Path, follow_env: str
) -> None:
    run = _make_run(tmp_path, "5")
    node_log = run.logs_dir / "attempt-0" / "node1.out"
    node_log.parent.mkdir()
    node_log.write_text("[rank0]: first\n[rank0]: partial")
    states = iter(["RUNNING", "RUNNING", "COMPLETED"])
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        with node_log.open("a") as handle:
            handle.write(" line\n")

    out = io.StringIO()
    final = logs.follow(
        run,
        logs.Filter(),
        lambda: JobState("5", next(states)),
        out,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert final.state == "COMPLETED"
    printed = out.getvalue().splitlines()
    assert printed[:2] == ["node1 rank0 | first", "node1 rank0 | partial line"]
    assert all(line == "node1 launcher |  line" for line in printed[2:]) and len(printed) > 3


TORCHRUN_FAILURE = """\
[rank3]:[rank3]: Traceback (most recent call last):
[rank3]:[rank3]:   File "/tmp/boom.py", line 6, in <module>
[rank3]:[rank3]:     raise ValueError("rank three exploded")
[rank3]:[rank3]: ValueError: rank three exploded
[rank2]:[rank2]: RuntimeError: Connection closed by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_07:51:18
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 16149)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {time}
  host      : localhost
  rank      : {rank} (local_rank: 1)
  exitcode  : {code} (pid: 16154)
  error_file: <N/A>
============================================================
"""


def test_the_cause_is_the_earliest_root_cause_and_its_error(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "6")
    folder = run.logs_dir / "attempt-0"
    folder.mkdir()
    (folder / "node1.err").write_text(
        TORCHRUN_FAILURE.format(time="2026-12-03_07:51:17", rank=3, code=1)
    )
    (folder / "node2.err").write_text(
        TORCHRUN_FAILURE.format(time="2026-12-03_07:51:19", rank=0, code=-9)
    )
    cause = why.cause(why.read(run, JobState("6", "FAILED")))
    assert cause is not None and (cause.rank, cause.node) == (3, "node1")
    assert cause.headline.startswith("rank 3 on node1 raised ValueError: rank three exploded")
    assert "node1 rank3 ! ValueError: rank three exploded" in cause.evidence


# torch 1.13 (Debian 12's, in container images) ignores the prefix template: "[default<local>]:".
TORCH_1_LINES = """\
[default0]:epoch 1 step 5
[default1]:Traceback (most recent call last):
[default1]:ValueError: local one exploded
[default0]:RuntimeError: Connection closed by peer
"""


def test_torch_1_lines_are_labelled_with_their_local_rank_and_its_failure_found(
    tmp_path: Path,
) -> None:
    run = _make_run(tmp_path, "8")
    folder = run.logs_dir / "attempt-0"
    folder.mkdir()
    (folder / "node2.out").write_text("[default0]:epoch 1 step 5\nagent line\n")
    report = TORCHRUN_FAILURE.split("torch.distributed", 1)[1]
    (folder / "node2.err").write_text(
        TORCH_1_LINES + report.format(time="2026-12-03_07:51:17", rank=3, code=1)
    )
    lines = list(logs.read_all(run, logs.Filter(node="node2")))
    assert lines[:2] == ["node2 local0 | epoch 1 step 5", "node2 launcher | agent line"]
    assert "node2 local1 ! ValueError: local one exploded" in lines
    # The global rank is not in the line, so a rank filter cannot claim it.
    assert list(logs.read_all(run, logs.Filter(rank=0))) == []
    cause = why.cause(why.read(run, JobState("8", "FAILED")))
    assert cause is not None and (cause.rank, cause.node) == (3, "node2")
    assert cause.headline.startswith("rank 3 on node2 raised ValueError: local one exploded")


def test_a_warning_is_no_failure(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "7")
    (run.logs_dir / "attempt-0").mkdir()
    (run.logs_dir / "attempt-0" / "node1.err").write_text("[rank0]: a warning\n")
    cause = why.cause(why.read(run, JobState("7", "FAILED")))
    assert cause is not None and cause.kind is why.Kind.UNKNOWN, cause


def test_a_full_disk_leaves_no_half_written_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clustertrain.backends.slurm import Slurm, SlurmBackend
    from clustertrain.pipeline.schedule import schedule

    job = render(job_spec(), str(tmp_path / "runs" / "mnist-x"), "/w")
    real_write = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "launch.sh":
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)  # type: ignore[arg-type]

    class NeverCalled(Slurm):
        def submit(self, job: object) -> str:
            raise AssertionError("nothing may be queued")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        schedule(job, SlurmBackend(NeverCalled()), check=False)
    assert list((tmp_path / "runs").iterdir()) == []


def _tail(logs_dir: Path, now: list[float], watcher: Watcher | None = None) -> follow.Tail:
    return follow.Tail(logs_dir, "7", lambda log: True, lambda: now[0], watcher=watcher)


def _cycle(tail: follow.Tail, now: list[float]) -> list[bytes]:
    now[0] += follow.CYCLE_S
    return [raw for _, raw in tail.poll()]


def test_the_follower_sweeps_every_quiet_file_within_a_sweep_and_finds_new_ones(
    tmp_path: Path, watcher: Watcher | None
) -> None:
    folder = tmp_path / "logs" / "attempt-0"
    folder.mkdir(parents=True)
    for k in range(30):
        (folder / f"node{k}.out").write_text(f"old {k}\n")
    now = [0.0]
    tail = _tail(tmp_path / "logs", now, watcher)
    assert sorted(_cycle(tail, now)) == sorted(f"old {k}".encode() for k in range(30))
    # Long quiet, then one line in each file: every one is seen within one sweep of cycles.
    for _ in range(int(follow.QUIET_AFTER_S / follow.CYCLE_S) + 2):
        assert _cycle(tail, now) == []
    for k in range(30):
        with (folder / f"node{k}.out").open("a") as handle:
            handle.write(f"new {k}\n")
    seen = [line for _ in range(follow.SWEEP_CYCLES) for line in _cycle(tail, now)]
    assert sorted(seen) == sorted(f"new {k}".encode() for k in range(30))
    # A node file that appears later (a requeued attempt) is found and read.
    later = tmp_path / "logs" / "attempt-1"
    later.mkdir()
    (later / "node1.err").write_text("second attempt\n")
    assert _cycle(tail, now) == [b"second attempt"]
    assert tail.files[str(later / "node1.err")].log.attempt == 1


def test_the_follower_keeps_no_history_and_caps_a_line_without_end(
    tmp_path: Path, watcher: Watcher | None
) -> None:
    folder = tmp_path / "logs" / "attempt-0"
    folder.mkdir(parents=True)
    log = folder / "node1.out"
    log.write_bytes(b"x" * (follow.MAX_PARTIAL + 10))
    now = [0.0]
    tail = _tail(tmp_path / "logs", now, watcher)
    assert [len(line) for line in _cycle(tail, now)] == [follow.MAX_PARTIAL + 10]
    tracked = tail.files[str(log)]
    assert (tracked.offset, tracked.partial) == (follow.MAX_PARTIAL + 10, b"")
    # A log swapped for a symlink is not read, whatever it points at.
    secret = tmp_path / "secret"
    secret.write_text("do not show\n" * 100)
    log.unlink()
    log.symlink_to(secret)
    assert _cycle(tail, now) == [] and list(tail.finish()) == []


def test_lost_nodes_are_read_back_from_the_batch_log(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "8")
    assert logs.lost_nodes(run) == []
    (run.logs_dir / "slurm-8.err").write_text(
        "srun: error: node1: task 0: Exited with exit code 1\n"
        "srun: error: Node failure on node2\n"
        "slurmstepd-node1: error: *** JOB 8 ON node1 CANCELLED DUE TO NODE FAILURE ***\n"
        "srun: error: Node failure on node2\nsrun: error: Node failure on node4\x1b[2J\n"
    )
    assert logs.lost_nodes(run) == ["node2", "node4\\x1b[2J"]


def test_a_run_records_its_backend_and_its_id_is_checked_against_it(tmp_path: Path) -> None:
    """Which backend owns a run is what job.json says, never guessed from its id; an id that is
    not its backend's is refused."""
    import json

    from clustertrain import backends
    from clustertrain.jobstate import JOB_IDS

    assert set(backends.BACKENDS) == set(JOB_IDS)
    for name in backends.BACKENDS:
        assert backends.named(name).name == name
    run = _make_run(tmp_path, "7")
    record = json.loads((run.path / runs.RECORD).read_text())
    assert record["backend"] == "slurm" and runs.read_run(run.path).backend == "slurm"
    for backend, job_id in (("local", "7"), ("slurm", "local-7"), ("k8s", "7")):
        (run.path / runs.RECORD).write_text(
            json.dumps({**record, "backend": backend, "job_id": job_id})
        )
        with pytest.raises(UserError, match="bad (job_id|backend)"):
            runs.read_run(run.path)
    del record["backend"]  # recorded before the field: read as Slurm's (an old local run: refused)
    (run.path / runs.RECORD).write_text(json.dumps(record))
    assert runs.read_run(run.path).backend == "slurm"


def test_a_failure_report_is_read_line_by_line_whatever_the_stderr_holds() -> None:
    """46 kB of headings without their fields once made one regular expression backtrack for
    over a minute (`status` of such a job hung); line by line it is one pass."""
    hostile = ["Root Cause (first observed failure): time : x rank : y"] * 850  # 46 kB
    assert logs.root_cause(hostile) is None
    report = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-06_01:02:03",
        "  host      : node2",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : -6 (pid: 4242)",
    ]
    assert logs.root_cause([*hostile[:50], *[""] * 40, *report]) == {
        "time": ("2026-12-06_01:02:03",),
        "rank": ("3", "1"),
        "exit": ("-6",),
    }


def test_a_huge_line_and_a_huge_log_are_read_in_bounded_pieces(
    tmp_path: Path, watcher: Watcher | None
) -> None:
    """A 3 MiB line comes out in pieces of at most MAX_PARTIAL, both when read and followed;
    a log that grew by 20 MiB at once is followed a chunk a cycle, every line once."""
    run = _make_run(tmp_path, "7")
    folder = run.logs_dir / "attempt-0"
    folder.mkdir()
    big = b"x" * (3 * follow.MAX_PARTIAL) + b"\nafter\n"
    (folder / "node1.out").write_bytes(big)
    read = [line.split(" | ", 1)[1] for line in logs.read_all(run, logs.Filter())]
    assert read[-1] == "after" and len(read) == 4
    assert max(len(piece) for piece in read) <= follow.MAX_PARTIAL
    many = b"".join(b"line %08d\n" % i for i in range(2_000_000))  # 30 MiB
    (folder / "node2.out").write_bytes(many)
    now = [0.0]
    tail = _tail(run.logs_dir, now, watcher)
    seen = []
    for _ in range(20):
        seen += [raw for log, raw in _cycle_logs(tail, now) if log.node == "node2"]
    seen += [raw for log, raw in tail.finish() if log.node == "node2"]
    assert len(seen) == 2_000_000 and seen[-1] == b"line 01999999" and len(set(seen)) == len(seen)


def _cycle_logs(tail: follow.Tail, now: list[float]) -> list[tuple[follow.LogFile, bytes]]:
    now[0] += follow.CYCLE_S
    return list(tail.poll())


def test_symlinked_folders_inside_a_run_folder_are_not_followed(tmp_path: Path) -> None:
    """tasks/, out/ and a hung step's heartbeats planted as symlinks to folders elsewhere: their
    files are not read (status, results, the hang report)."""
    import json

    from clustertrain import protocol
    from clustertrain.runs import sweeps

    run = _make_run(tmp_path / "runs", "8")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "0").mkdir(parents=True)
    (elsewhere / "metrics.jsonl").write_text(json.dumps({"event": "done", "secret": 1}) + "\n")
    (elsewhere / protocol.HANG_FILE).write_text("a secret of someone else's\n")
    sweeps.write_table(run.path, (("lr", ("1",)),))
    (run.path / sweeps.TASKS_DIR).symlink_to(elsewhere)
    with pytest.raises(UserError, match="a symlink, not a task's folder"):
        runs.tasks(run)
    if run.out_dir.exists():
        run.out_dir.rmdir()
    run.out_dir.symlink_to(elsewhere)
    planted = {"time": time.time(), "event": "metrics", "attempt": 0, "secret": 1}
    (elsewhere / protocol.EVENTS_FILE).write_text(json.dumps(planted) + "\n")
    run.events_path.unlink(missing_ok=True)
    run.events_path.symlink_to(elsewhere / protocol.EVENTS_FILE)
    assert run.metrics() == []
    attempt = run.logs_dir / "attempt-0"
    attempt.mkdir(parents=True)
    (attempt / f"{protocol.HEARTBEAT_DIR}-hung-1").symlink_to(elsewhere)
    (attempt / protocol.HEARTBEAT_DIR).symlink_to(elsewhere)
    assert logs.hang(run) is None


def test_a_folder_swapped_for_a_link_after_it_was_listed_leads_nowhere(
    tmp_path: Path, watcher: Watcher | None
) -> None:
    """The race the checks alone leave open: ``logs/attempt-0`` is listed as a folder, then
    swapped for a symlink to someone else's folder before its files are read. Every read
    opens each part from the run folder's descriptor (openat, O_NOFOLLOW), so what is read is
    the run's or nothing: the follower, the whole-log reader, the failure and hang readers."""
    from clustertrain import protocol
    from clustertrain.files import RunFolderError, open_regular

    run = _make_run(tmp_path / "runs", "9")
    attempt = run.logs_dir / "attempt-0"
    attempt.mkdir(parents=True)
    (attempt / "node1.out").write_bytes(b"mine\n")
    now = [0.0]
    tail = follow.Tail(
        run.logs_dir, run.job_id, lambda log: True, lambda: now[0], run.folder, watcher
    )
    assert [line for _, line in _cycle_logs(tail, now)] == [b"mine"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "node1.out").write_bytes(b"mine\na secret of someone else's\n")
    (elsewhere / protocol.HEARTBEAT_DIR).mkdir()
    (elsewhere / protocol.HEARTBEAT_DIR / protocol.HANG_FILE).write_text("a secret\n")
    attempt.rename(tmp_path / "gone")
    attempt.symlink_to(elsewhere)  # listed already: the follower reads it without listing again
    assert _cycle_logs(tail, now) == [] and list(tail.finish()) == []
    with pytest.raises(RunFolderError, match="cannot be read"):
        open_regular(attempt / "node1.out", within=run.path)
    with pytest.raises(RunFolderError, match="not inside"):
        open_regular(tmp_path / "elsewhere" / "node1.out", within=run.path)
    with pytest.raises(RunFolderError, match="not inside"):
        open_regular(run.path / ".." / run.path.name / "job.json", within=run.path)
    found = logs.LogFile(attempt / "node1.out", 0, "node1", "out")
    assert list(logs._lines(found.path, run.folder)) == []
    assert open_regular(run.path / "job.json", within=run.path).read(1) == b"{"


def test_a_failed_setup_line_is_read_back_from_the_batch_log_or_a_nodes(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "8")

    def setup() -> str | None:
        return why.read(run, JobState("8", "FAILED")).setup

    assert setup() is None
    run.logs_dir.mkdir(parents=True, exist_ok=True)
    (run.logs_dir / "slurm-8.err").write_text(
        "Lmod has detected the following error: ...\n"
        "clustertrain: setup line 2 failed (exit 1): module load \x1b[2Jno-such-module\n"
    )
    assert setup() == "setup line 2 failed (exit 1): module load \\x1b[2Jno-such-module"
    (run.logs_dir / "slurm-8.err").write_text("clustertrain: setup line x failed: forged\n")
    assert setup() is None  # not what the batch script prints
    (run.logs_dir / "attempt-0").mkdir()
    (run.logs_dir / "attempt-0" / "node2.err").write_text(
        "[rank2]:clustertrain: node_setup line 1 failed on node2 (exit 3): forged by a rank\n"
        "clustertrain: node_setup line 1 failed on node2 (exit 3): source /no/such/venv\n"
    )
    assert setup() == "node_setup line 1 failed on node2 (exit 3): source /no/such/venv"

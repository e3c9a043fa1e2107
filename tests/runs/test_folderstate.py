"""A job's state when Slurm cannot be asked: what its run folder alone implies, and a follower
that keeps reading the run folder, asks Slurm again with a bounded backoff and ends with the
job."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.errors import SchedulerUnreachable
from clustertrain.jobstate import RUN_FOLDER, SLURM, JobState
from clustertrain.rank import events
from clustertrain.render import render
from clustertrain.runs import folderstate, logs
from clustertrain.runs.folderstate import RETRY_FIRST_S, RETRY_MAX_S
from tests.conftest import job_spec
from tests.runs.test_timeline import PREEMPTED_ONCE

T0 = 1e9
DOWN = "cannot ask Slurm about job 7: Unable to contact slurm controller (connect failure)"


def _events(rows: list[tuple[float, str, int, dict]]) -> list[events.Event]:
    return [events.Event(T0 + at, name, attempt, values) for at, name, attempt, values in rows]


RUNNING = [
    (0.0, "queued", 0, {}),
    (2.0, "started", 0, {"nodes": "node[1-2]"}),
    (9.0, "step", 0, {"epoch": 1, "step": 10, "loss": 1.5}),
]


def test_an_end_with_status_0_is_completed_with_what_the_folder_knows() -> None:
    found = _events([*RUNNING, (69.0, "ended", 0, {"status": "0"})])
    state = folderstate.implied("7", found, T0 + 100)
    assert (state.state, state.exit_code, state.source) == ("COMPLETED", "0:0", RUN_FOLDER)
    assert (state.nodes, state.elapsed, state.restarts) == ("node[1-2]", "00:01:07", 0)
    assert state.finished and state.reason == ""


@pytest.mark.parametrize(
    ("status", "code", "said"),
    [
        ("1", "1:0", "its supervisor ended with exit status 1"),
        ("143", "143:0", "exit status 143 (signal 15: cancelled, or the time limit?)"),
        ("oops\x1b[2J", "", "its supervisor ended with no exit status"),
    ],
)
def test_an_end_with_another_status_is_failed(status: str, code: str, said: str) -> None:
    state = folderstate.implied("7", _events([*RUNNING, (9.5, "ended", 0, {"status": status})]), T0)
    assert (state.state, state.exit_code, state.source) == ("FAILED", code, RUN_FOLDER)
    assert said in state.reason and state.finished


@pytest.mark.parametrize(
    ("rows", "reason", "restarts"),
    [
        (RUNNING, "running as of its last event (step, 21s ago)", 0),
        (PREEMPTED_ONCE[:12], "requeued as of its last event (requeued, 17s ago)", 0),
        (PREEMPTED_ONCE[:-1], "running as of its last event (epoch, 1s ago)", 1),
        (RUNNING[:1], "queued as of its last event (queued, 30s ago)", 0),
        ([], "no events", 0),
    ],
)
def test_no_end_is_unknown_as_of_the_folder_last_event(
    rows: list[tuple[float, str, int, dict]], reason: str, restarts: int
) -> None:
    state = folderstate.implied("7", _events(rows), T0 + 30)
    assert (state.state, state.reason, state.restarts) == ("UNKNOWN", reason, restarts)
    assert not state.finished and state.source == RUN_FOLDER


def test_nodes_that_are_no_slurm_node_list_are_left_out() -> None:
    for nodes, shown in (("node[1-2],gpu-3", "node[1-2],gpu-3"), ("n1\tn2", ""), ("$(id)", "")):
        started = _events([(2.0, "started", 0, {"nodes": nodes})])
        assert folderstate.implied("7", started, T0).nodes == shown


def test_a_job_requeued_then_ended_is_the_newest_attempt() -> None:
    state = folderstate.implied("7", _events(PREEMPTED_ONCE), T0 + 30)
    assert (state.state, state.restarts, state.elapsed) == ("COMPLETED", 1, "00:00:09")


# ---------------------------------------------------------------------------------------------
# Run folders, and the fallback every reader shares.


def _run(root: Path, job_id: str = "7", **fields: object) -> runs.Run:
    job = render(job_spec(name="mnist", nodes=2, **fields), str(runs.new_run_dir(root, "m")), "/w")
    runs.write_run_files(job)
    return runs.record_submission(job, job_id, "slurm")


def _append(run: runs.Run, name: str, **values: object) -> None:
    with run.events_path.open("a") as handle:
        line = {"time": time.time(), "event": name, "attempt": 0, **values}
        handle.write(json.dumps(line) + "\n")


def _unreachable() -> JobState:
    raise SchedulerUnreachable(DOWN)


def test_ask_answers_from_the_folder_and_says_why(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _append(run, "started", nodes="node[1-2]")
    _append(run, "ended", status="0")
    answer = folderstate.ask(run, _unreachable)
    assert answer.state.state == "COMPLETED" and answer.state.source == RUN_FOLDER
    assert answer.unreachable == DOWN
    said = folderstate.ask(run, lambda: JobState("7", "CANCELLED", source=SLURM))
    assert said.state.state == "CANCELLED" and said.unreachable is None


def test_a_recorded_end_stands_where_slurm_no_longer_knows_the_job(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert folderstate.ask(run, lambda: JobState("7", "UNKNOWN")).state.source == SLURM
    _append(run, "started", nodes="node1")
    _append(run, "ended", status="1")
    answer = folderstate.ask(run, lambda: JobState("7", "UNKNOWN"))
    assert (answer.state.state, answer.state.source) == ("FAILED", RUN_FOLDER)


def test_a_sweep_folder_state_is_its_tasks(tmp_path: Path) -> None:
    run = _run(tmp_path, sweep={"lr": [0.1, 0.2]})
    for number, status in ((0, "0"), (1, "1")):
        task = runs.task(run, number)
        _append(task, "started", nodes="node1")
        _append(task, "ended", status=status)
    state = folderstate.folder_state(run)
    assert (state.state, state.tasks, state.source) == (
        "FAILED", ((0, "COMPLETED"), (1, "FAILED")), RUN_FOLDER,
    )  # fmt: skip
    assert folderstate.folder_state(runs.task(run, 0)).state == "COMPLETED"


def test_list_asks_an_unreachable_backend_once(tmp_path: Path) -> None:
    asked: list[str] = []

    def scheduler() -> JobState:
        asked.append("scontrol")
        raise SchedulerUnreachable(DOWN)

    asker = folderstate.Asker()
    found = [asker.ask(_run(tmp_path, str(n)), "slurm", scheduler) for n in (1, 2, 3)]
    assert asked == ["scontrol"] and {a.unreachable for a in found} == {DOWN}
    assert asker.ask(_run(tmp_path, "4"), "local", lambda: JobState("4", "RUNNING")).state.state


# ---------------------------------------------------------------------------------------------
# Following while Slurm cannot be asked.


class Flaky:
    """A scheduler that cannot be reached ``failures`` times, then answers ``then``; each ask
    at the fake clock's time is recorded."""

    def __init__(self, failures: int, clock: list[float], then: str = "RUNNING") -> None:
        self.failures, self.clock, self.then = failures, clock, then
        self.asked: list[float] = []

    def __call__(self) -> JobState:
        self.asked.append(self.clock[0])
        if len(self.asked) <= self.failures:
            raise SchedulerUnreachable(DOWN)
        return JobState("7", self.then)


def test_watch_backs_off_from_1_s_doubling_to_15_s_and_says_each_change_once(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    now, said = [0.0], []
    flaky = Flaky(7, now)
    watch = folderstate.Watch(run, flaky, said.append, lambda: now[0])
    states = []
    while len(flaky.asked) < 8:
        states.append(watch.state())
        now[0] += watch.wait_s(logs.STATE_POLL_S)
    gaps = [b - a for a, b in zip(flaky.asked, flaky.asked[1:], strict=False)]
    assert gaps == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert (gaps[0], gaps[-1]) == (RETRY_FIRST_S, RETRY_MAX_S)
    assert {s.source for s in states[:-1]} == {RUN_FOLDER} and states[-1].state == "RUNNING"
    assert len(said) == 2, said
    assert said[0].startswith(DOWN) and "following the run folder" in said[0]
    assert said[1].startswith("the controller answers again (after ")


def test_watch_retries_at_most_every_15_s_while_slurm_stays_down(tmp_path: Path) -> None:
    now, said = [0.0], []
    flaky = Flaky(100, now)
    watch = folderstate.Watch(_run(tmp_path), flaky, said.append, lambda: now[0])
    while now[0] < 300:
        watch.state()
        now[0] += 1.0  # asked every second: Slurm only when its retry is due
    gaps = [b - a for a, b in zip(flaky.asked, flaky.asked[1:], strict=False)]
    assert gaps[:4] == [1.0, 2.0, 4.0, 8.0] and set(gaps[4:]) == {15.0}
    assert len(said) == 1


def _follow(
    run: runs.Run, scheduler: Flaky, now: list[float], sleep: Callable[[float], None]
) -> tuple[JobState, list[str], list[str]]:
    said: list[str] = []
    lines = logs.follow_lines(run, logs.Filter(), scheduler, lambda: now[0], sleep, said.append)
    shown = []
    while True:
        try:
            shown.append(next(lines))
        except StopIteration as end:
            return end.value, shown, said


def test_follow_ends_with_the_folder_end_event_while_slurm_is_down(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _append(run, "started", nodes="node[1-2]")
    log = run.logs_dir / "attempt-0" / "node1.out"
    log.parent.mkdir()
    now = [0.0]
    flaky = Flaky(10_000, now)

    def sleep(seconds: float) -> None:
        now[0] += seconds
        assert now[0] < 600, "the follower never ended"
        if now[0] == 20.0:
            log.write_text("[rank0]: last words\n")
            _append(run, "ended", status="0")

    final, shown, said = _follow(run, flaky, now, sleep)
    assert (final.state, final.source) == ("COMPLETED", RUN_FOLDER)
    assert shown == ["node1 rank0 | last words"]
    assert 20.0 <= now[0] <= 24.0  # within a state poll of the end event
    assert len(said) == 1 and "following the run folder" in said[0]


def test_follow_goes_on_with_slurm_once_it_answers_again(tmp_path: Path) -> None:
    run = _run(tmp_path)
    now = [0.0]
    flaky = Flaky(3, now, then="COMPLETED")

    def sleep(seconds: float) -> None:
        now[0] += seconds
        assert now[0] < 600, "the follower never ended"

    final, _, said = _follow(run, flaky, now, sleep)
    assert (final.state, final.source) == ("COMPLETED", SLURM)
    assert len(flaky.asked) == 4 and len(said) == 2

"""A job's events read back as attempts, phases, goodput and progress, and drawn as a PNG.

The events are those of a job preempted once, as the batch script and the MNIST entrypoint
write them (the end-to-end preemption test checks a real job's)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clustertrain import events, runs
from clustertrain.render import render
from clustertrain.runs import goodput, timeline
from tests.conftest import job_spec, run_cli

PREEMPTED_ONCE = [
    (0.0, "queued", 0, {}),
    (2.0, "started", 0, {"nodes": "node[1-2]"}),
    (3.0, "node_check", 0, {}),
    (6.0, "rendezvous", 0, {"seconds": 3.0}),
    (7.0, "data_ready", 0, {"seconds": 4.0}),
    (9.0, "step", 0, {"epoch": 1, "step": 10, "steps": 20, "epochs": 2, "loss": 1.5}),
    (11.0, "checkpoint", 0, {"epoch": 1, "seconds": 0.1}),
    (11.1, "epoch", 0, {"epoch": 1, "step": 20, "steps": 20, "epochs": 2, "test_acc": 0.9}),
    (12.0, "signal", 0, {"why": "USR2"}),
    (12.5, "checkpoint", 0, {"epoch": 2, "step": 5, "seconds": 0.1}),
    (12.6, "stop", 0, {"why": "SIGUSR2"}),
    (13.0, "requeued", 0, {}),
    (20.0, "started", 1, {"nodes": "node[1-2]"}),
    (21.0, "node_check", 1, {}),
    (24.0, "data_ready", 1, {"seconds": 4.0}),
    (26.0, "step", 1, {"epoch": 2, "step": 30, "steps": 20, "epochs": 2, "loss": 0.5}),
    (28.0, "checkpoint", 1, {"epoch": 2, "seconds": 0.1}),
    (28.1, "epoch", 1, {"epoch": 2, "step": 40, "steps": 20, "epochs": 2, "test_acc": 0.98}),
    (29.0, "ended", 1, {"status": "0"}),
]


def _write(path: Path, rows: list[tuple[float, str, int, dict]], t0: float = 1e9) -> None:
    with path.open("a") as handle:
        for at, name, attempt, values in rows:
            handle.write(json.dumps({"time": t0 + at, "event": name, "attempt": attempt, **values}))
            handle.write("\n")


def _read(tmp_path: Path, rows: list[tuple[float, str, int, dict]]) -> list[events.Event]:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "events.jsonl"
    _write(path, rows)
    return events.read(path)


def test_a_job_preempted_once_is_two_attempts_with_their_phases_in_order(tmp_path: Path) -> None:
    found = _read(tmp_path, PREEMPTED_ONCE)
    attempts = timeline.attempts(found)
    assert [a.number for a in attempts] == [0, 1]
    assert [a.how for a in attempts] == ["requeued", "ended 0"]
    assert [e.name for e in attempts[0].events][:5] == [
        "started", "node_check", "rendezvous", "data_ready", "step",
    ]  # fmt: skip
    assert [(p.name, p.start - 1e9, p.end - 1e9) for p in attempts[0].phases()] == [
        ("start-up", 2.0, 7.0),
        ("training", 7.0, 13.0),
    ]
    waits = [(n, p.start - 1e9, p.end - 1e9) for n, p in timeline.waits(found, attempts)]
    assert waits == [(0, 0.0, 2.0), (1, 13.0, 20.0)]
    # Goodput: productive training over the wall time, (6 - 0.2 saving) + (5 - 2 restoring -
    # 0.1 saving) s of the 27 s from the first start to the last end.
    assert goodput.goodput(found).share == pytest.approx(8.7 / 27)


def test_training_after_the_last_checkpoint_of_a_killed_attempt_is_lost(tmp_path: Path) -> None:
    killed = [row for row in PREEMPTED_ONCE if row[2] == 0 and row[0] <= 11.1]
    killed.append((15.0, "step", 0, {"epoch": 2, "step": 30, "steps": 20, "epochs": 2}))
    attempt = timeline.attempts(_read(tmp_path, killed))[0]
    assert attempt.how == "killed"
    assert [(p.name, p.end - 1e9) for p in attempt.phases()] == [
        ("start-up", 7.0),
        ("training", 11.0),
        ("lost", 15.0),
    ]
    # Killed before its first checkpoint: all of its training is lost.
    early = _read(tmp_path / "early", [row for row in killed if row[1] != "checkpoint"])
    attempt = timeline.attempts(early)[0]
    assert [(p.name, p.end - 1e9) for p in attempt.phases()] == [("start-up", 7.0), ("lost", 15.0)]
    assert goodput.goodput(early).share == 0.0


def test_progress_says_where_the_newest_attempt_is_and_how_long_is_left(tmp_path: Path) -> None:
    rows = [row for row in PREEMPTED_ONCE if row[0] <= 26.0]
    rows.append((30.0, "step", 1, {"epoch": 2, "step": 35, "steps": 20, "epochs": 2}))
    moving = timeline.progress(timeline.attempts(_read(tmp_path, rows)), "test_acc")
    assert moving is not None and moving.headline is not None
    # 5 steps in 4 s; 5 steps left.
    assert (moving.epoch, moving.step, moving.headline.value, moving.eta_s) == (2, 35, 0.9, 4.0)
    assert moving.line() == "progress: epoch 2/2, step 35, test_acc 0.9 so far, about 4s left"
    unnamed = timeline.progress(timeline.attempts(_read(tmp_path, rows)))
    assert unnamed is not None and unnamed.line() == "progress: epoch 2/2, step 35, about 4s left"


def test_malformed_events_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        'not json\n{"event": "started"}\n{"time": "x", "event": "ended", "attempt": 0}\n'
        '{"time": 1, "event": "rm -rf", "attempt": 0}\n{"time": NaN, "event": "step"}\n'
        '{"time": 5, "event": "step", "attempt": 0, "loss": "big", "nodes": 7, "step": 3}\n'
        '{"time": 6, "event": "step", "attempt": 0, "nodes": 7, "step": 4}\n'
    )
    # A value that is not a finite number drops its event (issue 24): a picture drawn from
    # half an event would be as wrong as one drawn from a bogus one.
    assert events.read(path) == [events.Event(6.0, "step", 0, {"step": 4})]
    (tmp_path / "link.jsonl").symlink_to(path)
    assert events.read(tmp_path / "link.jsonl") == []


def test_a_step_restarted_after_a_hang_loses_only_what_followed_its_last_checkpoint() -> None:
    seen = [
        events.Event(100.0, "started", 0, {}),
        events.Event(104.0, "rendezvous", 0, {}),
        events.Event(105.0, "step", 0, {"step": 1}),
        events.Event(110.0, "checkpoint", 0, {}),
        events.Event(112.0, "step", 0, {"step": 9}),
        events.Event(130.0, "hang", 0, {"step": 9, "seconds": 16.0}),
        events.Event(130.1, "restarted", 0, {"why": "hang"}),
        events.Event(134.0, "rendezvous", 0, {}),
        events.Event(135.0, "step", 0, {"step": 10}),
        events.Event(150.0, "ended", 0, {"status": "0"}),
    ]
    (attempt,) = timeline.attempts(seen)
    assert [(p.name, p.start, p.end) for p in attempt.phases()] == [
        ("start-up", 100.0, 105.0),
        ("training", 105.0, 110.0),
        ("lost", 110.0, 130.1),  # after the last checkpoint, the hang included
        ("start-up", 130.1, 135.0),
        ("training", 135.0, 150.0),
    ]
    (restart,) = timeline.restarts([attempt])
    assert (
        restart.line()
        == "step restarted in attempt 0 after a hang: training again 21 s after the fault"
    )
    assert goodput.goodput(seen).share == pytest.approx(20 / 50)


def test_a_step_restarted_on_a_spare_names_the_lost_node_and_counts_from_its_last_beacon() -> None:
    seen = [
        events.Event(100.0, "started", 0, {}),
        events.Event(105.0, "step", 0, {"step": 1}),
        events.Event(109.0, "node_lost", 0, {"nodes": "node2", "seconds": 8.0}),
        events.Event(111.0, "restarted", 0, {"why": "node_lost"}),
        events.Event(118.0, "step", 0, {"step": 2}),
        events.Event(130.0, "ended", 0, {"status": "0"}),
    ]
    (restart,) = timeline.restarts(timeline.attempts(seen))
    assert restart.line() == (
        "step restarted in attempt 0 after node2 lost: training again 17 s after the fault"
    )


def test_an_event_outside_the_jobs_own_time_is_left_out_with_one_warning(tmp_path: Path) -> None:
    """One appended line of {"time": 1e308} made plot draw a 1e308-second axis and say 0 %
    goodput: events outside the job's window, or with values that are not finite, are dropped."""
    job = render(job_spec(nodes=2), str(runs.new_run_dir(tmp_path, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "9", "slurm")
    _write(run.events_path, PREEMPTED_ONCE[1:], t0=events.read(run.events_path)[0].time)
    honest = goodput.goodput(run.events()).share
    with open(run.events_path, "a") as handle:
        handle.write('{"time": 1e308, "event": "step", "attempt": 1, "step": 9}\n')
        handle.write('{"time": 5, "event": "step", "attempt": 1, "step": 9}\n')
        now = json.dumps(time.time())
        handle.write(f'{{"time": {now}, "event": "step", "attempt": 1, "loss": 1e999}}\n')
    said: list[str] = []
    assert goodput.goodput(run.events(said.append)).share == honest
    assert len(said) == 1 and "3 line(s) left out" in said[0]
    assert max(e.time for e in events.read(run.events_path)) == 1e308  # the raw reader keeps it
    done = run_cli("plot", "9", "-o", str(tmp_path / "job9.png"), "--runs-dir", str(tmp_path))
    assert done.returncode == 0 and done.stderr.count("warning:") == 1, done.stderr


def test_plot_draws_one_png_of_a_run(tmp_path: Path) -> None:
    job = render(job_spec(nodes=2), str(runs.new_run_dir(tmp_path, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "9", "slurm")
    _write(run.events_path, PREEMPTED_ONCE[1:], t0=events.read(run.events_path)[0].time)
    done = run_cli("plot", "9", "-o", str(tmp_path / "job9.png"), "--runs-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "job9.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_cli("plot", "9", "-o", str(tmp_path / "job9.svg"), "--runs-dir", str(tmp_path))
    assert bad.returncode == 2 and "output:" in bad.stderr


def test_plot_of_a_queued_job_draws_and_never_writes_through_a_planted_symlink(
    tmp_path: Path,
) -> None:
    """A job still PENDING has its queued event only; a plot.png planted in its run folder as a
    symlink (a run folder is anyone's to write) is replaced, its target left as it was."""
    job = render(job_spec(nodes=2), str(runs.new_run_dir(tmp_path, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "9", "slurm")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run.path / "plot.png").symlink_to(victim)
    done = run_cli("plot", "9", "--runs-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    picture = run.path / "plot.png"
    assert not picture.is_symlink() and picture.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in run.path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_jobs_plot_says_why_under_its_title() -> None:
    from clustertrain.runs import plot

    assert plot.titled("job 9", None) == "job 9"
    said = plot.titled("job 9", "rank 1 on node1 raised ValueError: \x1b]0;owned\x07 " + "x" * 300)
    title, cause = said.split("\n")
    assert title == "job 9" and cause.startswith("rank 1 on node1 raised ValueError: ")
    assert cause.isprintable() and "\x1b" not in cause and len(cause) <= 160

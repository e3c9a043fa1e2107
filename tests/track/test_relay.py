"""The relay against a fake tracker: each record once, across relays, requeues and failures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.errors import UserError
from clustertrain.track import position, records, relay
from tests.track.conftest import Fake, write


def _steps(fake: Fake, name: str) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in fake.sent if p.name == name]


def test_every_metric_at_its_step_once_across_relays(run: runs.Run) -> None:
    write(run, "started", nodes="node[1-2]")
    for step in range(3):
        write(run, "metrics", step=step * 10, loss=1.0 / (step + 1), test_acc=0.5 + step / 10)
    first = Fake()
    summary = relay(run, first, print)
    assert summary.sent == 6
    assert _steps(first, "test_acc") == [(0, 0.5), (10, 0.6), (20, 0.7)]
    assert first.sent_params["nodes"] == "2"
    assert first.sent_params["env"] == "TOKEN (values not sent)"  # never the value
    assert first.sent_tags["clustertrain.job_id"] == "42"
    assert first.sent_tags["clustertrain.state"] == "RUNNING"

    again = Fake()
    assert relay(run, again, print).sent == 0  # stopped and started: nothing twice
    assert again.sent == [] and "params" not in again.calls
    assert again.kept["run"] == first.kept["run"]  # the same tracker run

    write(run, "metrics", step=30, loss=0.2)
    later = Fake()
    relay(run, later, print)
    assert _steps(later, "loss") == [(30, 0.2)]  # and nothing missed


def test_a_requeued_job_lands_in_one_run_steps_continuing(run: runs.Run) -> None:
    write(run, "started", nodes="node[1-2]")
    write(run, "metrics", loss=1.0)
    write(run, "metrics", loss=0.9)
    write(run, "requeued")
    first = Fake()
    relay(run, first, print)
    write(run, "started", attempt=1, nodes="node[3-4]")
    write(run, "metrics", attempt=1, loss=0.8)
    write(run, "restarted", attempt=1)
    write(run, "metrics", attempt=1, loss=0.7)
    write(run, "ended", attempt=1, status="0")
    second = Fake()
    summary = relay(run, second, print)
    assert second.kept["run"] == first.kept["run"]
    assert _steps(first, "loss") + _steps(second, "loss") == [
        (0, 1.0), (1, 0.9), (2, 0.8), (3, 0.7)
    ]  # fmt: skip
    assert _steps(first, records.REQUEUES) == [(1, 1.0)]
    assert _steps(second, records.RESTARTS) == [(2, 1.0)]
    assert second.sent_tags["clustertrain.attempts"] == "2"
    assert second.sent_tags["clustertrain.nodes"] == "node[3-4]"
    assert summary.state == "COMPLETED" and second.ended is not None
    assert second.ended[0] == "COMPLETED"
    assert run.path / "spec.yaml" in second.ended[1]
    third = Fake()
    relay(run, third, print)
    assert third.ended is None  # the end is sent once


def test_a_line_being_written_waits_for_its_end(run: runs.Run) -> None:
    write(run, "metrics", step=1, loss=1.0)
    with open(run.events_path, "a", encoding="utf-8") as handle:
        handle.write('{"time": 1e9, "event": "metr')
    fake = Fake()
    relay(run, fake, print)
    assert _steps(fake, "loss") == [(1, 1.0)]
    with open(run.events_path, "a", encoding="utf-8") as handle:
        handle.write('ics"}\n')
    write(run, "metrics", step=2, loss=0.5)
    again = Fake()
    relay(run, again, print)
    assert _steps(again, "loss") == [(2, 0.5)]


def test_what_is_no_number_is_skipped_counted_and_said_once(run: runs.Run) -> None:
    with open(run.events_path, "a", encoding="utf-8") as handle:
        handle.write('{"time": 1e9, "event": "metrics", "step": 1, "loss": "nan"}\n')
        handle.write("not json at all\n")
        handle.write('{"time": 1e9, "event": "metrics", "step": 1, "loss": NaN}\n')
    write(run, "metrics", step=2, loss=0.5)
    said: list[str] = []
    summary = relay(run, Fake(), said.append)
    assert summary.skipped == 3 and summary.sent == 1
    assert len([line for line in said if "skipped" in line]) == 1


def test_a_cut_events_file_is_said_and_nothing_is_sent_again(run: runs.Run) -> None:
    for step in range(5):
        write(run, "metrics", step=step, loss=1.0)
    relay(run, Fake(), print)
    run.events_path.write_text("", encoding="utf-8")
    said: list[str] = []
    fake = Fake()
    relay(run, fake, said.append)
    assert fake.sent == [] and any("shorter" in line for line in said)


def test_a_forged_position_is_refused_not_taken_for_the_start(run: runs.Run) -> None:
    write(run, "metrics", step=1, loss=1.0)
    where = position.path(run, "fake")
    where.parent.mkdir()
    where.write_text(json.dumps({"offset": -5, "kept": {}}), encoding="utf-8")
    with pytest.raises(UserError, match="not a relay's position"):
        relay(run, Fake(), print)


def test_an_unreachable_tracker_is_said_once_and_nothing_is_lost(run: runs.Run) -> None:
    write(run, "metrics", step=1, loss=1.0)
    said: list[str] = []
    waits: list[float] = []
    fake = Fake(down=2)
    relay(run, fake, said.append, sleep=waits.append)
    assert _steps(fake, "loss") == [(1, 1.0)]
    assert waits == [1.0, 2.0]
    assert len([line for line in said if "cannot reach" in line]) == 1

    write(run, "metrics", step=2, loss=0.5)
    with pytest.raises(UserError, match="nothing was lost"):
        relay(run, Fake(down=100), said.append, sleep=waits.append, tries=3)
    after = Fake()
    relay(run, after, print)
    assert _steps(after, "loss") == [(2, 0.5)]


def test_follow_relays_until_the_job_ended(run: runs.Run) -> None:
    write(run, "started", nodes="node1")
    fake = Fake()
    ticks: list[float] = []

    def tick(seconds: float) -> None:
        ticks.append(seconds)
        write(run, "metrics", step=len(ticks), loss=1.0 / len(ticks))
        if len(ticks) == 3:
            write(run, "ended", status="1")

    summary = relay(run, fake, print, follow=True, sleep=tick)
    assert [step for step, _ in _steps(fake, "loss")] == [1, 2, 3]
    assert summary.state == "FAILED"


def test_follow_ends_when_the_scheduler_says_the_job_ended(run: runs.Run) -> None:
    write(run, "metrics", step=1, loss=1.0)
    fake = Fake()
    summary = relay(run, fake, print, follow=True, state=lambda: "CANCELLED")
    assert summary.state == "CANCELLED" and fake.ended is not None


def test_a_forged_events_file_is_read_to_its_last_whole_record(run: runs.Run) -> None:
    write(run, "metrics", step=1, loss=1.0)
    with open(run.events_path, "ab") as handle:
        handle.write(b"\x00\xff" * 9_000_000 + b"\n")  # one line longer than a read
    write(run, "metrics", step=2, loss=0.5)
    with open(run.events_path, "ab") as handle:
        handle.write(b'{"time": 1e9, "event": "metrics", "step": 3, "lo')  # cut mid-record
    fake = Fake()
    summary = relay(run, fake, print)
    assert _steps(fake, "loss") == [(1, 1.0), (2, 0.5)] and summary.skipped >= 1


def test_an_events_file_that_is_a_symlink_is_not_read(run: runs.Run, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text('{"time": 1e9, "event": "metrics", "step": 1, "loss": 1.0}\n')
    run.events_path.unlink()
    run.events_path.symlink_to(elsewhere)
    fake = Fake()
    assert relay(run, fake, print).sent == 0 and fake.sent == []


def test_a_run_folder_you_cannot_write_is_one_line(run: runs.Run) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    write(run, "metrics", step=1, loss=1.0)
    run.path.chmod(0o500)
    try:
        with pytest.raises(UserError, match="cannot keep what was sent"):
            relay(run, Fake(), print)
    finally:
        run.path.chmod(0o700)

"""``clustertrain report`` as users run it: a job's cost and goodput from its run folder alone
(a local run has no accounting), a sweep's rows and total, a period's, CSV and JSON for
pandas, and bad input: a period that is none, a run folder with forged events."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from clustertrain.runs.cost import COLUMNS
from tests.conftest import run_cli

HOUR = 3600.0
# A job preempted once and requeued, as its supervisor and script write their events (times
# from its start).
EVENTS = [
    (0.0, "queued", 0, {}),
    (2.0, "started", 0, {"nodes": "node1"}),
    (3.0, "node_check", 0, {}),
    (7.0, "data_ready", 0, {"seconds": 4.0}),
    (9.0, "step", 0, {"step": 10}),
    (11.0, "checkpoint", 0, {"seconds": 0.5}),
    (13.0, "requeued", 0, {}),
    (20.0, "started", 1, {}),
    (21.0, "node_check", 1, {}),
    (24.0, "data_ready", 1, {}),
    (26.0, "step", 1, {"step": 30}),
    (29.0, "ended", 1, {"status": "0"}),
]


def write_run(
    root: Path, folder: str, job_id: str, ago_s: float, rows: list[tuple] = EVENTS
) -> Path:
    """A run folder as ``submit`` writes it, submitted ``ago_s`` seconds ago."""
    submitted = time.time() - ago_s
    path = root / folder
    path.mkdir(parents=True)
    record = {
        "job_id": job_id, "name": "mnist", "nodes": 1, "world_size": 2,
        "submitted_at": datetime.fromtimestamp(submitted, timezone.utc).isoformat(),
        "launcher": "torchrun", "backend": "local" if job_id.startswith("local-") else "slurm",
    }  # fmt: skip
    (path / "job.json").write_text(json.dumps(record))
    write_events(path, rows, submitted)
    return path


def write_events(path: Path, rows: list[tuple], start: float) -> None:
    with (path / "events.jsonl").open("w") as handle:
        for at, name, attempt, values in rows:
            line = {"time": start + at, "event": name, "attempt": attempt, **values}
            handle.write(json.dumps(line) + "\n")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # A Slurm whose configuration is not there: its accounting cannot be asked, whatever
    # cluster this host runs.
    return {
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "SLURM_CONF": str(tmp_path / "no-slurm.conf"),
    }


def report(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = run_cli("report", *args, env=env)
    return done.returncode, done.stdout, done.stderr


def test_a_local_runs_cost_is_its_run_folders_with_what_is_missing_said(
    env: dict[str, str], tmp_path: Path
) -> None:
    write_run(tmp_path / "runs", "mnist-1", "local-4242", HOUR)
    code, out, err = report(env, "local-4242")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "job local-4242 (mnist): COMPLETED, 2 attempts, 0 restarts (figures from run folder)"
    )
    assert "  queue wait   2s" in lines
    assert "  wall time    27s (first start to last end; 20s allocated)" in lines
    assert any(line.startswith("  goodput      ") for line in lines), out
    assert any(line.split()[:2] == ["requeue", "wait"] and "7s" in line for line in lines), out
    assert (
        "  GPU-hours: not known (no accounting: a local run); from the run folder: 0.01 "
        "process-hours (2 process(es), a GPU each on a GPU job)"
    ) in lines


def test_csv_and_json_are_a_row_per_job_with_the_documented_columns(
    env: dict[str, str], tmp_path: Path
) -> None:
    write_run(tmp_path / "runs", "mnist-1", "local-4242", HOUR)
    code, out, err = report(env, "last", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 1
    assert (rows[0]["job_id"], rows[0]["source"], rows[0]["gpu_hours"]) == (
        "local-4242", "run folder", "",
    )  # fmt: skip
    code, out, err = report(env, "--format", "json")
    assert code == 0, err
    parsed = json.loads(out)
    assert parsed[0]["badput_requeue_wait_s"] == 7.0 and parsed[0]["gpu_hours"] is None


def test_a_sweep_is_a_row_per_task_and_the_total(env: dict[str, str], tmp_path: Path) -> None:
    path = write_run(tmp_path / "runs", "sweep-1", "77", HOUR, rows=[])
    (path / "sweep.json").write_text(
        json.dumps({"tasks": [{"task": k, "params": {"lr": str(k)}} for k in (0, 1)]})
    )
    for k in (0, 1):
        (path / "tasks" / str(k)).mkdir(parents=True)
        write_events(path / "tasks" / str(k), EVENTS, time.time() - HOUR)
    code, out, err = report(env, "77")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "sweep 77 (mnist): 2 jobs, figures from run folder"
    assert [line.split()[0] for line in lines[2:5]] == ["77_0", "77_1", "total"]
    assert lines[4].split()[1:3] == ["4s", "54s"]  # the queue waits and wall times summed
    assert "GPU-hours: not known for any of the 2 jobs" in out
    code, out, _ = report(env, "77", "--format", "csv")
    assert [row["job_id"] for row in csv.DictReader(io.StringIO(out))] == ["77_0", "77_1"]


def test_since_totals_the_jobs_submitted_within_the_period(
    env: dict[str, str], tmp_path: Path
) -> None:
    write_run(tmp_path / "runs", "new", "local-1", HOUR)
    write_run(tmp_path / "runs", "newer", "local-2", 2 * HOUR)
    write_run(tmp_path / "runs", "old", "local-3", 9 * 24 * HOUR)
    code, out, err = report(env, "--since", "7d")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "jobs submitted in the last 7d: 2 jobs, figures from run folder"
    assert [line.split()[0] for line in lines[2:5]] == ["local-2", "local-1", "total"]
    code, out, _ = report(env, "--since", "90m", "--format", "json")
    assert [row["job_id"] for row in json.loads(out)] == ["local-1"]
    assert report(env, "--since", "30m")[1] == "no jobs submitted in the last 30m\n"
    assert report(env, "--since", "30m", "--format", "json")[1] == "[]\n"


@pytest.mark.parametrize("period", ["7", "7x", "7 days", "-1d", "0h", "1.5d"])
def test_a_period_that_is_none_is_one_line_and_exit_2(env: dict[str, str], period: str) -> None:
    code, out, err = report(env, "--since", period)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("clustertrain: error: --since: "), err
    assert "give a number and d, h or m (7d, 12h, 30m)" in err


def test_a_job_and_a_period_at_once_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    write_run(tmp_path / "runs", "mnist-1", "local-4242", HOUR)
    code, _, err = report(env, "local-4242", "--since", "7d")
    assert code == 2 and "give a job or --since PERIOD, not both" in err


FORGED = [
    '{"time": NaN, "event": "started", "attempt": 0}',
    '{"time": 1e308, "event": "ended", "attempt": 0, "status": "0"}',
    '{"time": -5, "event": "started", "attempt": 0}',
    '{"time": %(t)s, "event": "started", "attempt": -3}',
    '{"time": %(t)s, "event": "started", "attempt": 9999}',
    '{"time": %(t)s, "event": "checkpoint", "attempt": 0, "seconds": -1e300}',
    '{"time": %(t1)s, "event": "hang", "attempt": 0, "seconds": 1e300}',
    '{"time": %(t1)s, "event": "restarted", "attempt": 0, "why": "\\u001b[2J"}',
    '{"time": %(t2)s, "event": "checkpoint", "attempt": 0, "seconds": 99999999999}',
    '{"time": %(t2)s, "event": "step", "attempt": 0, "step": 1e400}',
    '{"time": %(t)s, "event": "ended", "attempt": 0, "status": "$(id)"}',
    "not json at all",
]


def test_forged_events_still_give_a_report_and_no_traceback(
    env: dict[str, str], tmp_path: Path
) -> None:
    path = write_run(tmp_path / "runs", "mnist-1", "local-4242", HOUR, rows=[])
    now = time.time() - HOUR
    values = {"t": now, "t1": now + 1, "t2": now + 2}
    (path / "events.jsonl").write_text("\n".join(line % values for line in FORGED) + "\n")
    for form in ("text", "csv", "json"):
        code, out, err = report(env, "--format", form)
        assert code == 0 and "Traceback" not in err, err
        assert out.isprintable() or all(line.isprintable() for line in out.splitlines())
    code, out, _ = report(env, "--format", "json")
    row = json.loads(out)[0]
    assert row["goodput"] is None or 0.0 <= row["goodput"] <= 1.0
    assert all(row[k] is None or row[k] >= 0 for k in row if k.endswith("_s"))


def test_help_has_an_example() -> None:
    done = run_cli("report", "--help")
    assert done.returncode == 0 and "clustertrain report --since 7d" in done.stdout

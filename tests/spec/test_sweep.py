"""Sweeps as job arrays: the parameter table, the rendered array script, the run folder of
tasks, their results; bad sweeps refused in one line with nothing written."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from clustertrain import events, runs
from clustertrain.backends.slurm import parse_scontrol_job
from clustertrain.errors import FieldError, UserError
from clustertrain.jobstate import JobState
from clustertrain.render import render
from clustertrain.runs import results
from clustertrain.spec import sweep
from tests.conftest import job_spec, run_cli

HOSTILE = "$(touch /tmp/pwned) `id` ; 'x' \"y\" \\ %a #"


def test_the_tasks_are_the_product_in_order_and_a_later_layer_wins() -> None:
    spec = job_spec({"sweep": {"lr": [0.1, 0.2], "seed": [1]}}, sweep=["seed=1,2"])
    assert sweep.tasks(spec.sweep) == [
        {"lr": "0.1", "seed": "1"},
        {"lr": "0.1", "seed": "2"},
        {"lr": "0.2", "seed": "1"},
        {"lr": "0.2", "seed": "2"},
    ]
    assert sweep.task_args({"lr": "0.1", "seed": "2"}) == ["--lr", "0.1", "--seed", "2"]
    assert job_spec().sweep == () and sweep.tasks(()) == []


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--sweep", "lr="], "sweep.lr"),
        (["--sweep", "lr=0.1,,0.2"], "sweep.lr"),
        (["--sweep", "lr=0.1,0.1"], "sweep.lr"),
        (["--sweep", "--lr=0.1"], "sweep name"),
        (["--sweep", "lr"], "sweep"),
        (
            [
                "--sweep",
                "a=" + ",".join(map(str, range(101))),
                "--sweep",
                "b=" + ",".join(map(str, range(100))),
            ],
            "sweep",
        ),  # fmt: skip
        (["--max-parallel", "2"], "max_parallel"),
    ],
)
def test_a_bad_sweep_is_one_line_and_nothing_is_written(
    flags: list[str], field: str, tmp_path: Path
) -> None:
    done = run_cli("submit", *flags, env={"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert done.returncode == 2 and done.stderr.startswith(f"clustertrain: error: {field}")
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_the_array_script_gives_each_task_its_folder_and_arguments(tmp_path: Path) -> None:
    spec = job_spec(nodes=2, sweep=["lr=0.1,0.2", f"note={HOSTILE}"], max_parallel=1)
    job = render(spec, "/runs/s", "/w")
    assert "--array=0-1%1" in job.directives
    assert "--output=/runs/s/tasks/%a/logs/slurm-%A_%a.out" in job.directives
    # The task's folder, as bash sets it for Slurm's task 1; its words are the plan's, data that
    # the supervisor hands srun as they are (tests/node/test_supervisor.py).
    line = re.search(r"^export TASK_DIR=.*$", job.batch_script, re.MULTILINE)
    assert line is not None
    shown = subprocess.run(
        ["bash", "-c", f'SLURM_ARRAY_TASK_ID=1\n{line[0]}\nprintf "%s\\n" "$TASK_DIR"'],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert shown.stdout.splitlines() == ["/runs/s/tasks/1"]
    assert json.loads(job.plan)["tasks"]["1"] == ["--lr", "0.2", "--note", HOSTILE]
    assert 'export CLUSTERTRAIN_OUT_DIR="$TASK_DIR/out"' in job.batch_script
    assert job.launch_script.rstrip().endswith('"$@"')
    assert "task 1: lr=0.2 note=" in job.dry_run_text()


def test_the_run_folder_holds_a_folder_per_task_found_by_its_id(tmp_path: Path) -> None:
    job = render(
        job_spec(nodes=2, sweep=["lr=0.1,0.2,0.4"], metric="test_acc"), str(tmp_path / "s"), "/w"
    )
    runs.write_run_files(job)
    run = runs.record_submission(job, "40", "slurm")
    assert [t.job_id for t in runs.tasks(run)] == ["40_0", "40_1", "40_2"]
    task = runs.find_run(tmp_path, "40_2")
    assert task.path == tmp_path / "s" / "tasks" / "2" and task.logs_dir.is_dir()
    assert json.loads((task.events_path).read_text())["event"] == "queued"
    with pytest.raises(UserError, match="no task 3"):
        runs.find_run(tmp_path, "40_3")
    # Results: the headline (the job's metric) best first; a task that logged none last.
    for number, acc in ((0, 0.97), (1, 0.99)):
        events.append(run.path / "tasks" / str(number) / "events.jsonl", "epoch", test_acc=acc)
    state = JobState("40", "RUNNING", tasks=((0, "COMPLETED"), (1, "COMPLETED"), (2, "RUNNING")))
    rows = results.rows(run, state)
    assert [(r.task, r.params["lr"], r.state, r.value) for r in rows] == [
        (1, "0.2", "COMPLETED", 0.99),
        (0, "0.1", "COMPLETED", 0.97),
        (2, "0.4", "RUNNING", None),
    ]
    assert results.text(rows).splitlines()[0].split() == [
        "task",
        "lr",
        "state",
        "test_acc",
        "restarts",
    ]
    assert results.text(rows).splitlines()[1].split()[:4] == ["1", "0.2", "COMPLETED", "0.99"]
    # Lower is better for a loss: the same values, the other order.
    low = dataclasses.replace(run, metric="test_acc", metric_mode="min")
    assert [r.task for r in results.rows(low, state)] == [0, 1, 2]


def test_an_array_reads_as_one_state_with_a_count_per_state() -> None:
    text = (
        "JobId=12 ArrayJobId=10 ArrayTaskId=2 JobState=RUNNING\n"
        "JobId=10 ArrayJobId=10 ArrayTaskId=3-5%2 JobState=PENDING\n"
        "JobId=11 ArrayJobId=10 ArrayTaskId=1 JobState=COMPLETED\n"
    )
    state = parse_scontrol_job("10", text)
    assert (state.state, state.finished) == ("RUNNING", False)
    assert state.counts() == "1 COMPLETED, 1 RUNNING, 3 PENDING"
    done = parse_scontrol_job(
        "10", text.replace("RUNNING", "FAILED").replace("PENDING", "COMPLETED")
    )
    assert (done.state, done.finished) == ("FAILED", True)
    assert parse_scontrol_job("10_2", text.splitlines()[0]).state == "RUNNING"


def test_a_name_swept_twice_on_the_command_line_is_refused(cli_env: dict[str, str]) -> None:
    done = run_cli(
        "submit", "--sweep", "lr=1,2", "--sweep", "lr=3", "--module", "pkg.train", "--dry-run",
        env=cli_env,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("clustertrain: error: sweep: ") and "lr" in done.stderr
    assert "--sweep lr=1,2,3" in done.stderr and done.stderr.count("\n") == 1


def test_a_sweep_of_too_many_values_is_refused_from_its_count() -> None:
    """100,000 values: refused by counting them, before each is checked (that took 116 s)."""
    with pytest.raises(FieldError, match=r"sweep\.lr: invalid value 100000; is 100000 values"):
        sweep.parse("sweep", {"lr": list(range(100_000))})
    with pytest.raises(FieldError, match="is given twice"):
        sweep.parse("sweep", {"lr": [1, 2, 1]})

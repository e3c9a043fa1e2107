"""What a job cost (clustertrain.runs.cost): accounting's figures where it kept the job, the run
folder's otherwise with each missing figure said, a sweep's or a period's totals, and the rows
``report --format csv|json`` prints."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from clustertrain.errors import UserError
from clustertrain.jobstate import Allocation
from clustertrain.runs import Run, cost_text
from clustertrain.runs.cost import COLUMNS, cost, period_s, since, total
from tests.runs.test_goodput import HUNG_THEN_REQUEUED, T0, made

NOW = T0 + 100


def run(job_id: str = "42", submitted_at: str = "2001-09-09T01:46:40+00:00") -> Run:
    return Run(Path("/runs/mnist-1"), job_id, "mnist", submitted_at, 2, 4, "torchrun")


# As sacct -X -D prints a job requeued once: its first allocation, then its second, each
# 2 nodes and 2 GPUs. The batch script starts a second before the supervisor's first event.
REQUEUED = (
    Allocation("42", "REQUEUED", T0, T0 + 1, T0 + 22, 21, 2, 2),
    Allocation("42", "COMPLETED", T0 + 22, T0 + 29, T0 + 42, 13, 2, 2),
)


def test_accountings_figures_and_the_events_buckets() -> None:
    found = cost(run(), made(HUNG_THEN_REQUEUED), REQUEUED, NOW)
    assert (found.source, found.state) == ("sacct", "COMPLETED")
    assert (found.attempts, found.restarts) == (2, 1)
    assert (found.queue_wait_s, found.wall_s, found.allocated_s) == (1.0, 41.0, 34.0)
    assert (found.nodes, found.gpus) == (2, 2)
    assert found.node_hours == pytest.approx(34 * 2 / 3600)
    assert found.gpu_hours == pytest.approx(34 * 2 / 3600)
    # The events span 39 s of accounting's 41: Slurm's start to the supervisor's, its end.
    assert dict(found.badput)["other"] == pytest.approx(2.0)
    assert found.goodput == pytest.approx(13.25 / 41.0)
    assert found.missing == ()


def test_without_accounting_the_run_folder_answers_and_says_what_is_missing() -> None:
    found = cost(run(), made(HUNG_THEN_REQUEUED), None, NOW, "no accounting: a local run")
    assert (found.source, found.state) == ("run folder", "COMPLETED")
    assert (found.queue_wait_s, found.wall_s, found.allocated_s) == (2.0, 39.0, 31.0)
    assert found.node_hours is None and found.gpu_hours is None
    assert found.folder_process_hours == pytest.approx(31 * 4 / 3600)
    assert found.goodput == pytest.approx(13.25 / 39.0)
    assert found.missing == (
        "node-hours: not known (no accounting: a local run); from the run folder: 0.02 "
        "(2 node(s) x 31s in its attempts)",
        "GPU-hours: not known (no accounting: a local run); from the run folder: 0.03 "
        "process-hours (4 process(es), a GPU each on a GPU job)",
    )


def test_accounting_that_does_not_know_the_job_yet_is_said() -> None:
    other = (Allocation("43", "COMPLETED", T0, T0, T0 + 1, 1, 1, 1),)
    found = cost(run(), made(HUNG_THEN_REQUEUED), other, NOW)
    assert found.source == "run folder"
    assert "accounting has no record of it yet" in found.missing[0]


def test_what_sacct_printed_that_could_not_be_read_is_unreadable() -> None:
    garbled = (
        Allocation("42", "COMPLETED", None, T0 + 1, T0 + 42, None, None, None,
                   ("Submit", "ElapsedRaw", "AllocTRES")),
    )  # fmt: skip
    found = cost(run(), made(HUNG_THEN_REQUEUED), garbled, NOW)
    assert found.queue_wait_s is None and found.gpu_hours is None and found.wall_s == 41.0
    said = "\n".join(found.missing)
    assert "queue wait: unreadable (sacct's Submit); from the run folder: 2s" in said
    assert "node-hours: unreadable (sacct's ElapsedRaw and AllocTRES)" in said
    assert "GPU-hours: unreadable (sacct's AllocTRES or ElapsedRaw)" in said


def test_a_cluster_that_does_not_account_for_gpus_says_so() -> None:
    no_gpus = (Allocation("42", "COMPLETED", T0, T0 + 1, T0 + 42, 41, 2, None),)
    found = cost(run(), made(HUNG_THEN_REQUEUED), no_gpus, NOW)
    assert found.node_hours == pytest.approx(41 * 2 / 3600) and found.gpu_hours is None
    assert found.missing[0].startswith("GPU-hours: not known (sacct's AllocTRES names no gres/gpu")


def test_a_job_still_running_ends_for_now_at_its_elapsed_time() -> None:
    running = (Allocation("42", "RUNNING", T0, T0 + 1, None, 30, 2, 2),)
    found = cost(run(), made(HUNG_THEN_REQUEUED[:10]), running, NOW)
    assert (found.state, found.wall_s) == ("RUNNING", 30.0)


def test_no_events_is_no_goodput_said_in_a_line() -> None:
    found = cost(run(), [], None, NOW, "no accounting: a local run")
    assert found.goodput is None and found.attempts == 0
    assert "queue wait: not known (no accounting: a local run; no queued and started events)" in (
        found.missing
    )
    assert found.missing[-1] == "goodput: not known (no attempt in the run folder's events)"
    assert cost_text.lines(found)[0].startswith("job 42 (mnist): UNKNOWN, 0 attempts")


def test_a_sweeps_total_sums_its_tasks_and_says_what_some_lack() -> None:
    events = made(HUNG_THEN_REQUEUED)
    tasks = (Allocation("42_0", "COMPLETED", T0, T0 + 1, T0 + 42, 41, 2, 2),)
    parts = [cost(run("42_0"), events, tasks, NOW), cost(run("42_1"), events, tasks, NOW)]
    whole = total("42", "sweep", parts)
    assert whole.state == "2 COMPLETED" and whole.source == "mixed"
    assert whole.wall_s == 41.0 + 39.0 and whole.attempts == 4
    assert whole.gpu_hours == pytest.approx(41 * 2 / 3600)
    assert "GPU-hours: known for 1 of 2 (the total sums those)" in whole.missing
    assert whole.goodput == pytest.approx(2 * 13.25 / (41.0 + 39.0))
    text = cost_text.table(whole, "sweep 42 (sweep)")
    assert text[1].split() == ["job", "state", "queue", "wait", "wall", "time", "node-h",
                               "GPU-h", "goodput", "name"]  # fmt: skip
    assert text[2].split()[:2] == ["42_0", "COMPLETED"] and text[4].split()[0] == "total"


def test_rows_have_the_documented_columns_for_csv_and_json() -> None:
    found = cost(run(), made(HUNG_THEN_REQUEUED), REQUEUED, NOW)
    rows = list(csv.DictReader(io.StringIO(cost_text.as_csv([found]))))
    assert tuple(rows[0]) == COLUMNS and rows[0]["job_id"] == "42"
    assert float(rows[0]["badput_requeue_wait_s"]) == 8.0
    parsed = json.loads(cost_text.as_json([found]))
    assert tuple(parsed[0]) == COLUMNS and parsed[0]["gpus"] == 2


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800)])
def test_a_period_is_a_number_and_d_h_or_m(text: str, seconds: int) -> None:
    assert period_s(text) == seconds


@pytest.mark.parametrize("text", ["7", "7x", "-7d", "0d", "1e3d", "7 days", "", "9999999d"])
def test_anything_else_is_one_line_naming_since(text: str) -> None:
    with pytest.raises(UserError, match=r"^--since: .* is not a period; give a number and d"):
        period_s(text)


def test_since_keeps_the_runs_submitted_within_the_period() -> None:
    new, old = run("1", "2001-09-09T01:40:00+00:00"), run("2", "2001-09-01T00:00:00+00:00")
    bad = run("3", "yesterday")
    assert since([new, old, bad], 3600, T0) == [new]

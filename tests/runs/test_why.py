"""Why a job failed (clustertrain.runs.why): every case of the corpus in tests/fixtures/why read
from a run folder as status reads it, and hostile run folders that still get a cause."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from clustertrain import protocol, runs
from clustertrain.backends.slurm.parse import parse_accounting
from clustertrain.jobstate import JobState
from clustertrain.render import render
from clustertrain.runs import report, why
from tests.conftest import job_spec

CORPUS = Path(__file__).parent.parent / "fixtures" / "why"
CASES = sorted(p.parent.relative_to(CORPUS).as_posix() for p in CORPUS.glob("*/*/expected.json"))
JOB_ID = "42"


def _run(root: Path, metric: str | None = None) -> runs.Run:
    """A recorded 2-node job of 2 ranks a node, as submit leaves it."""
    spec = job_spec(name="why", nodes=2, procs_per_node=2, metric=metric)
    job = render(spec, str(runs.new_run_dir(root, "why")), "/w")
    runs.write_run_files(job)
    return runs.record_submission(job, JOB_ID, "slurm")


def _events(text: str) -> str:
    """The case's events, their times (seconds from the start) moved to just now: a run
    folder's events are read within the job's own time window."""
    start = time.time() - 50
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return "".join(json.dumps({**e, "time": start + e["time"]}) + "\n" for e in lines)


def _lay_out(case: Path, run: runs.Run) -> None:
    """The case's files where a run folder keeps them: node logs in logs/attempt-0, the batch
    shell's stderr, the watchdog's verdict, the events."""
    expected = json.loads((case / "expected.json").read_text())
    attempt = run.logs_dir / "attempt-0"
    attempt.mkdir(parents=True)
    logs_from = CORPUS / expected["logs_from"] if "logs_from" in expected else case
    for log in [*logs_from.glob("node*.err"), *logs_from.glob("node*.out")]:
        shutil.copy(log, attempt / log.name)
    if (case / "slurm.err").exists():
        shutil.copy(case / "slurm.err", run.logs_dir / f"slurm-{JOB_ID}.err")
    if (case / "hang.txt").exists():
        (attempt / "heartbeats").mkdir()
        shutil.copy(case / "hang.txt", attempt / "heartbeats" / "hang.txt")
    if (case / "events.jsonl").exists():
        run.events_path.write_text(_events((case / "events.jsonl").read_text()))


def _cause(tmp_path: Path, name: str) -> tuple[why.Cause | None, dict[str, object]]:
    case = CORPUS / name
    expected = json.loads((case / "expected.json").read_text())
    run = _run(tmp_path, expected.get("metric"))
    _lay_out(case, run)
    state = JobState(JOB_ID, **json.loads((case / "state.json").read_text()))
    sacct = case / "sacct.txt"
    accounting = parse_accounting(JOB_ID, sacct.read_text()) if sacct.exists() else None
    return why.cause(why.read(run, state, accounting)), expected


@pytest.mark.parametrize("name", CASES)
def test_every_case_of_the_corpus_names_its_kind_rank_and_node(tmp_path: Path, name: str) -> None:
    found, expected = _cause(tmp_path, name)
    assert found is not None
    assert found.kind == expected["kind"] == name.split("/")[0], found
    assert (found.rank, found.node) == (expected["rank"], expected["node"]), found
    assert str(expected["headline"]) in found.headline, found.headline
    assert found.hint and len(found.evidence) <= why.MAX_EVIDENCE
    for text in (found.headline, found.hint, found.decisive, *found.evidence):
        assert text.isprintable(), text


def test_the_corpus_has_every_kind() -> None:
    kinds = {name.split("/")[0] for name in CASES}
    assert kinds == {kind.value for kind in why.Kind}


def test_a_job_that_runs_or_completed_has_no_cause() -> None:
    assert why.cause(why.Records(state="RUNNING")) is None
    assert why.cause(why.Records(state="COMPLETED")) is None


def test_a_consequence_is_never_the_cause_while_another_rank_says_more() -> None:
    """gloo's "Connection closed by peer" on three ranks, and the error of the fourth: in any
    order, with any of them first in the launchers' reports."""
    lost = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:2478"
    tails = [why.Tail(f"node{r // 2 + 1}", r, (why_line,)) for r, why_line in
             ((0, lost), (1, lost), (2, "KeyError: 'lr'"), (3, lost))]  # fmt: skip
    for first in range(4):
        exits = (why.Exit(f"node{first // 2 + 1}", first, 1, "2026-12-07_10:00:00"),)
        found = why.cause(why.Records(state="FAILED", tails=tuple(tails), exits=exits))
        assert found is not None and found.kind is why.Kind.EXCEPTION, found
        assert found.rank == 2 and "KeyError: 'lr'" in found.headline


def test_an_abort_while_the_others_still_trained_is_no_finished_job() -> None:
    """The teardown's words, but a peer lost its collective to it: a signal, not died at exit."""
    tails = (
        why.Tail("node1", 0, ("terminate called without an active exception",)),
        why.Tail("node2", 2, ("RuntimeError: Connection closed by peer [10.0.0.1]:1",)),
    )
    exits = (why.Exit("node1", 0, -6, "2026-12-07_10:00:00"),)
    found = why.cause(why.Records(state="FAILED", tails=tails, exits=exits))
    assert found is not None and found.kind is why.Kind.SIGNAL, found
    assert found.headline.startswith("rank 0 on node1 aborted at exit (SIGABRT, signal 6)")


def test_an_abort_at_exit_while_a_rank_was_stopped_is_no_finished_job() -> None:
    """Its launcher's report lists another rank it stopped (SIGTERM): that rank had not
    finished, whatever its lines say."""
    tails = (why.Tail("node1", 0, ("terminate called without an active exception",)),)
    exits = (why.Exit("node1", 0, -6, "2026-12-07_10:00:00"), why.Exit("node1", 1, -15))
    found = why.cause(why.Records(state="FAILED", tails=tails, exits=exits))
    assert found is not None and found.kind is why.Kind.SIGNAL and found.rank == 0, found
    alone = why.cause(why.Records(state="FAILED", tails=tails, exits=exits[:1]))
    assert alone is not None and alone.kind is why.Kind.DIED_AT_EXIT, alone


def test_slurmstepd_words_of_an_earlier_attempt_do_not_outweigh_slurms_own_state() -> None:
    """The batch log keeps every attempt's lines: a preemption since requeued is not why the
    last attempt failed, where Slurm itself says FAILED."""
    batch = ("slurmstepd: error: *** JOB 42 ON node1 CANCELLED AT 2026-12-07T10:00:00 DUE TO "
             "PREEMPTION ***",)  # fmt: skip
    tails = (why.Tail("node1", 1, ("KeyError: 'lr'",)),)
    found = why.cause(why.Records(state="FAILED", tails=tails, batch=batch))
    assert found is not None and found.kind is why.Kind.EXCEPTION, found
    folder = why.cause(why.Records(state="FAILED", source="run folder", batch=batch))
    assert folder is not None and folder.kind is why.Kind.PREEMPTED, folder


def _hostile_run(tmp_path: Path) -> runs.Run:
    run = _run(tmp_path)
    (run.logs_dir / "attempt-0").mkdir()
    return run


def test_invalid_utf8_and_terminal_escapes_in_the_decisive_line_are_shown_escaped(
    tmp_path: Path,
) -> None:
    run = _hostile_run(tmp_path)
    (run.logs_dir / "attempt-0" / "node1.err").write_bytes(
        b"[rank1]: Traceback (most recent call last):\n"
        b'[rank1]:   File "/home/u/tr\xffain.py", line 3, in <module>\n'
        b"[rank1]: ValueError: bad \x1b]0;owned\x07 value \xc3\x28\x1b[2J\n"
    )
    found = why.cause(why.read(run, JobState(JOB_ID, "FAILED")))
    assert found is not None and found.kind is why.Kind.EXCEPTION and found.rank == 1
    assert "\x1b" not in found.headline and "\\x1b]0;owned\\x07" in found.headline
    assert "\x1b" not in found.decisive and "\ufffd" in found.decisive
    for text in (found.headline, found.hint, found.decisive, *found.evidence):
        assert text.isprintable(), text


def test_a_10_mb_line_is_read_bounded_and_the_headline_stays_one_short_line(
    tmp_path: Path,
) -> None:
    run = _hostile_run(tmp_path)
    with (run.logs_dir / "attempt-0" / "node1.err").open("wb") as log:
        log.write(b"[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: ")
        log.write(b"x" * (10 << 20) + b"\n")
    (run.logs_dir / f"slurm-{JOB_ID}.err").write_bytes(b"y" * (10 << 20))
    started = time.monotonic()
    records = why.read(run, JobState(JOB_ID, "FAILED"))
    found = why.cause(records)
    assert time.monotonic() - started < 5  # generous: the tails are bounded, not the time
    assert all(len(line) <= 2000 for tail in records.tails for line in tail.lines)
    assert found is not None and len(found.headline) <= 400 and "\n" not in found.headline


@pytest.mark.parametrize("state", ["FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "CANCELLED", "DEADLINE"])
def test_a_run_folder_with_no_rank_logs_still_gets_a_cause(tmp_path: Path, state: str) -> None:
    run = _hostile_run(tmp_path)  # ranks missing: no node's log at all
    found = why.cause(why.read(run, JobState(JOB_ID, state, exit_code="1:0")))
    assert found is not None and found.headline
    if state in ("FAILED", "DEADLINE"):
        assert found.headline.startswith(f"cause unknown: Slurm says {state}")


def test_a_forged_failure_report_and_a_symlinked_log_give_a_cause_not_a_traceback(
    tmp_path: Path,
) -> None:
    run = _hostile_run(tmp_path)
    secret = tmp_path / "secret.err"
    secret.write_text("[rank0]: ValueError: do not show\n")
    (run.logs_dir / "attempt-0" / "node2.err").symlink_to(secret)
    (run.logs_dir / "attempt-0" / "node1.err").write_text(
        "Root Cause (first observed failure):\n"
        "  time      : \x1b[2J\n  rank      : 99999999999999999999 (local_rank: 7)\n"
        "  exitcode  : -999999 (pid: 1)\n"
    )
    found = why.cause(why.read(run, JobState(JOB_ID, "FAILED")))
    assert found is not None and "do not show" not in " ".join(found.evidence)
    assert found.headline.isprintable()


def test_status_prints_the_headline_first_and_says_nothing_twice(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs")
    _lay_out(CORPUS / "node_lost" / "node-fail", run)
    said = report.report(run, JobState(JOB_ID, "NODE_FAIL"), lambda _: None)
    lines = said.lines()
    assert lines[0] == "node2 lost: Slurm declared it down and ended the job (NODE_FAIL)"
    assert lines[1].startswith("hint: ")
    assert not any(line.startswith("lost node(s):") for line in lines)


class _Backend:
    """What Job asks of its backend for a status: the state and the accounting."""

    def state(self, run: runs.Run) -> JobState:
        return JobState(JOB_ID, "FAILED", exit_code="1:0")

    def accounting(self, run: runs.Run) -> None:
        return None


def test_the_api_failure_is_the_cause_status_prints(tmp_path: Path) -> None:
    from clustertrain.api import Job

    run = _run(tmp_path / "runs")
    _lay_out(CORPUS / "exception" / "rank1-raises", run)
    job = Job(run, _Backend())  # type: ignore[arg-type]
    failure = job.failure
    assert failure is not None and failure.kind is why.Kind.EXCEPTION
    assert (failure.rank, failure.node) == (1, "node1")
    assert job.status().lines()[0] == failure.headline


def test_the_docs_table_has_a_row_for_every_kind() -> None:
    page = (Path(__file__).parent.parent.parent / "docs" / "why-it-failed.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`") for line in page.splitlines() if line[:3] == "| `"
    }
    assert rows == {kind.value for kind in why.Kind}


# torchelastic's log tailer at exit (tail_log.py: logger.exception), as the unchanged Lightning
# Fabric script's launcher printed it after rank 0 aborted in teardown.
LOG_TAILER = """\
E1207 19:08:23.500000 30100 torch/distributed/elastic/multiprocessing/tail_log.py:154] error in log tailer for default0. ValueError
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/tail_log.py", line 152, in stop
    f.result()
  File "/usr/lib/python3.11/concurrent/futures/_base.py", line 449, in result
    return self.__get_result()
           ^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/tail_log.py", line 56, in tail_logfile
    dst.write(f"{header}{line}")
ValueError: I/O operation on closed file.
"""  # noqa: E501


def test_a_launchers_log_tailer_at_exit_is_a_consequence_and_folded(tmp_path: Path) -> None:
    case = CORPUS / "died_at_exit" / "terminate-at-teardown"
    run = _run(tmp_path / "runs", "test_acc")
    _lay_out(case, run)
    node1 = run.logs_dir / "attempt-0" / "node1.err"
    lines = node1.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    node1.write_text("".join(lines[:at]) + LOG_TAILER + "".join(lines[at:]))
    state = JobState(JOB_ID, **json.loads((case / "state.json").read_text()))
    found = why.cause(why.read(run, state))
    assert found is not None and found.kind is why.Kind.DIED_AT_EXIT, found
    assert found.headline.startswith("finished, then rank 0 aborted at exit (SIGABRT")
    from clustertrain.runs import logs

    shown = list(logs.read_all(run, logs.Filter(node="node1")))
    assert not any("I/O operation on closed file" in line for line in shown), shown
    assert any("(a launcher's log tailer" in line for line in shown), shown


def test_a_rank_that_asked_not_to_be_restarted_is_named_with_its_own_line() -> None:
    """From the supervisor's event, or (a run without one) its launcher's report alone; the
    other ranks' consequences never outweigh it."""
    lost = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:2478"
    tails = (
        why.Tail("node2", 3, ("error: no data in /data/train; nothing to restart for",)),
        why.Tail("node1", 0, (lost,)),
    )
    exits = (why.Exit("node2", 3, protocol.NO_RESTART_EXIT, "2026-12-07_10:00:00"),)
    for records in (
        why.Records(state="FAILED", tails=tails, exits=exits),
        why.Records(state="FAILED", tails=tails, no_restart=(3, "node2")),
    ):
        found = why.cause(records)
        assert found is not None and found.kind is why.Kind.NO_RESTART, found
        assert (found.rank, found.node) == (3, "node2")
        assert found.headline == (
            "rank 3 on node2 asked not to be restarted (exit 79): error: no data in "
            "/data/train; nothing to restart for"
        )
    silent = why.cause(why.Records(state="FAILED", no_restart=(1, "node1")))
    assert silent is not None and silent.headline == (
        "rank 1 on node1 asked not to be restarted (exit 79)"
    )
    assert (silent.rank, silent.node) == (None, "node1")


def test_a_restart_storm_says_how_far_the_restarts_got_and_what_failed_each_time() -> None:
    tails = (why.Tail("node1", 1, ("ValueError: loss is nan at step 41",)),)
    found = why.cause(why.Records(state="FAILED", tails=tails, storm=(3, "step 40 of epoch 2")))
    assert found is not None and found.kind is why.Kind.RESTART_STORM, found
    assert found.headline == (
        "restart storm: 3 restarts never got past step 40 of epoch 2 (the last checkpoint); "
        "stopped restarting; the last: rank 1 on node1: ValueError: loss is nan at step 41"
    )
    assert "storm_restarts: 0" in found.hint and found.rank == 1
    bare = why.cause(why.Records(state="FAILED", storm=(2, "")))
    assert bare is not None and bare.headline == (
        "restart storm: 2 restarts never got past the last checkpoint; stopped restarting"
    )


def test_the_ranks_that_never_came_to_the_rendezvous_are_named() -> None:
    said = (
        "clustertrain.rank.env.RendezvousError: rank {r} on node1: rank 3 (on node2) never "
        "joined the rendezvous within 15 s; ranks 0-2 came: the absent ones did not start, "
        "or stopped before init_process_group"
    )
    tails = tuple(why.Tail(f"node{r // 2 + 1}", r, (said.format(r=r),)) for r in range(3))
    found = why.cause(why.Records(state="FAILED", tails=tails, nodes=("node1", "node2")))
    assert found is not None and found.kind is why.Kind.RENDEZVOUS, found
    assert found.headline == (
        "the rendezvous never formed: rank 3 (on node2) never joined; ranks 0-2 gave up waiting"
    )

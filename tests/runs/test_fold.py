"""A failed job reads in one screen: the failing rank's own error in full, the consequences in
other ranks and launchers folded to a line per run, everything with --raw.

The logs under tests/fixtures/failed-job are real: two torchrun launchers on one host standing for
two nodes, as the batch script starts them (tests/fixtures/failed-job/generate.sh).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustertrain import runs
from clustertrain.jobstate import JobState
from clustertrain.runs import fold, logs, why
from tests.conftest import ROOT, run_cli
from tests.runs.test_logs_and_runs import _make_run

FIXTURES = ROOT / "tests" / "fixtures" / "failed-job"
LAUNCHER_TRACEBACK = "Traceback (most recent call last):"


def _job(root: Path, case: str, job_id: str = "local-4242") -> runs.Run:
    """A run folder whose attempt 0 holds the logs of a fixture, as a failed local run."""
    run = _make_run(root, job_id)
    shutil.copytree(FIXTURES / case, run.logs_dir / "attempt-0", ignore=_not_logs)
    (run.path / "local.json").write_text(json.dumps({"exit_code": 1}))
    return run


def _not_logs(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if not name.endswith((".out", ".err"))]


def _lines(case: str, node: str) -> list[str]:
    return (FIXTURES / case / f"{node}.err").read_text(encoding="utf-8").splitlines()


def _accounted(shown: list[str]) -> int:
    """How many written lines the shown ones stand for: a summary its count, any other one."""
    return sum(
        int(line.split("... ")[1].split()[0]) if " lines folded (" in line else 1 for line in shown
    )


def test_the_failing_rank_keeps_its_traceback_and_the_launcher_report_is_one_line(
    tmp_path: Path,
) -> None:
    run = _job(tmp_path, "rank1-raises")
    shown = list(logs.read_all(run, logs.Filter(node="node1", errors=True)))
    written = _lines("rank1-raises", "node1")
    own = [line.removeprefix("[rank1]: [rank1]: ") for line in written if "[rank1]" in line]
    assert [line for line in shown if line.startswith("node1 rank1 ! ")] == [
        f"node1 rank1 ! {line}" for line in own
    ]
    assert own[-1] == "ValueError: rank 1 gave up at step 20"
    report = len(written) - written.index(LAUNCHER_TRACEBACK)
    assert shown[-1] == (
        f"node1 launcher ! ... {report} lines folded (a launcher's failure report); "
        "see them with --raw or in logs/attempt-0/node1.err"
    )
    assert not any("ChildFailedError" in line or "Root Cause" in line for line in shown)
    # rank0 lost its peer in an all-reduce: its traceback is one line, where it was written.
    lost = [line for line in shown if line.startswith("node1 rank0 ")]
    assert lost == [
        "node1 rank0 ! ... 9 lines folded (a lost peer); "
        "see them with --raw or in logs/attempt-0/node1.err"
    ]
    assert shown.index(lost[0]) < shown.index(next(s for s in shown if "closing signal" in s))
    assert _accounted(shown) == len(written)


def test_a_node_with_only_consequences_reads_in_three_lines(tmp_path: Path) -> None:
    run = _job(tmp_path, "rank1-raises")
    shown = list(logs.read_all(run, logs.Filter(node="node2", errors=True)))
    assert [line.split(" ... ")[0] for line in shown] == [
        "node2 rank2 !",
        "node2 rank3 !",
        "node2 launcher !",
    ]
    assert "(a lost peer, c10d stack frames, a lost rendezvous store)" in shown[-1]
    assert _accounted(shown) == len(_lines("rank1-raises", "node2"))


def test_the_mnist_story_the_error_is_not_lost(tmp_path: Path) -> None:
    """A job without its data: rank 0's one line, and node2's launcher stopped by SIGTERM."""
    run = _job(tmp_path, "mnist-without-data")
    shown = list(logs.read_all(run, logs.Filter()))
    raw = list(logs.read_all(run, logs.Filter(raw=True)))
    assert len(raw) == sum(len(_lines("mnist-without-data", n)) for n in ("node1", "node2"))
    assert len(shown) <= 10, shown
    assert shown[0].startswith("node1 rank0 ! error: MNIST is not in /nonexistent/mnist/")
    signalled = [line for line in shown if "a launcher stopped by a signal" in line]
    assert len(signalled) == 1 and signalled[0].startswith("node2 launcher ! ... ")
    assert any("SignalException: Process" in line for line in raw)


def test_raw_shows_every_line_as_today(tmp_path: Path) -> None:
    run = _job(tmp_path, "rank3-raises-alone")
    raw = list(logs.read_all(run, logs.Filter(raw=True, errors=True)))
    written = _lines("rank3-raises-alone", "node1") + _lines("rank3-raises-alone", "node2")
    assert len(raw) == len(written)
    assert "node1 launcher ! torch.distributed.elastic.multiprocessing.api.SignalException: " in (
        "\n".join(raw)
    )
    assert not any("lines folded" in line for line in raw)


def test_the_cause_names_the_rank_and_its_error_line(tmp_path: Path) -> None:
    cases = {
        "rank1-raises": "rank 1 on node1 raised ValueError: rank 1 gave up at step 20",
        "rank3-raises-alone": "rank 3 on node2 raised ValueError: boom",
        "mnist-without-data": "rank 0 on node1 did not find its data: "
        "error: MNIST is not in /nonexistent/mnist/MNIST/raw",
    }
    for case, head in cases.items():
        run = _job(tmp_path / case, case)
        cause = why.cause(why.read(run, JobState(run.job_id, "FAILED")))
        assert cause is not None and cause.headline.startswith(head), (case, cause)


def _fold(texts: list[str]) -> list[fold.Line]:
    folder = fold.Folder("node.err")
    out = [line for text in texts for line in folder.feed(fold.Line(None, None, text))]
    return out + list(folder.finish())


def test_a_chain_is_folded_or_shown_whole_and_a_launcher_own_error_is_shown() -> None:
    own_chain = [
        LAUNCHER_TRACEBACK,
        '  File "train.py", line 3, in <module>',
        "KeyError: 'lr'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        LAUNCHER_TRACEBACK,
        '  File "train.py", line 5, in <module>',
        "RuntimeError: Connection closed by peer",
    ]
    assert [line.text for line in _fold(own_chain)] == own_chain
    # The same chain in the other order: an error while handling a lost peer is a consequence.
    lost_chain = [*own_chain[6:], *own_chain[3:6], *own_chain[:3]]
    assert [line.folded for line in _fold(lost_chain)] == [len(lost_chain)]
    usage = [LAUNCHER_TRACEBACK, '  File "torchrun"', "ValueError: bad --nnodes"]
    assert [line.text for line in _fold(usage)] == usage


def test_slurms_stop_of_the_steps_and_nccls_abort_are_folded_but_a_jobs_own_end_is_not() -> None:
    slurm = [
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        "slurmstepd: error: *** STEP 42.0 ON node1 CANCELLED AT 2026-12-07T19:08:24 ***",
        "srun: error: node1: task 0: Exited with exit code 1",
        "srun: error: node2: task 1: Killed",
    ]
    assert [(line.folded, line.text.split(";")[0]) for line in _fold(slurm)] == [
        (4, "... 4 lines folded (Slurm's stop of the steps)")
    ]
    own_end = (
        "slurmstepd: error: *** JOB 42 ON node1 CANCELLED AT 2026-12-07T19:08:24 DUE TO TIME LIMIT"
        " ***"
    )
    oom = "srun: error: node2: task 3: Out Of Memory"
    assert [line.text for line in _fold([own_end, oom, *slurm[2:]])] == [own_end, oom, *slurm[2:]]
    nccl = [
        "[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=808, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
        "[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Some NCCL operations have failed or timed "
        "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might "
        "run on corrupted/incomplete data.",
        "[E ProcessGroupNCCL.cpp:1543] [PG 0 Rank 1] To avoid data inconsistency, we are taking "
        "the entire process down.",
        "[E ProcessGroupNCCL.cpp:1380] [PG 0 Rank 1] Process group watchdog thread terminated "
        "with exception: [Rank 1] Watchdog caught collective operation timeout",
    ]
    shown = _fold(nccl)
    assert [line.text for line in shown][0] == nccl[0]  # the first error, as written
    assert [line.folded for line in shown] == [0, 3]


def test_a_traceback_cut_off_by_the_end_of_the_file_is_shown() -> None:
    cut = [LAUNCHER_TRACEBACK, '  File "train.py", line 3, in <module>']
    assert [line.text for line in _fold(cut)] == cut


ALL_FILES = sorted(FIXTURES.glob("*/*.err"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_FILES), st.lists(st.integers(min_value=1, max_value=4000), max_size=8))
def test_following_a_file_in_any_pieces_prints_what_reading_it_after(
    path: Path, cuts: list[int]
) -> None:
    """The file is written in pieces cut anywhere (mid-line included) while it is followed."""
    data = path.read_bytes()
    bounds = sorted({min(cut, len(data)) for cut in cuts} | {len(data)})
    pieces = [data[a:b] for a, b in zip([0, *bounds], bounds, strict=False)]
    with tempfile.TemporaryDirectory() as tmp:
        run = _make_run(Path(tmp), "9")
        log = run.logs_dir / "attempt-0" / "node1.err"
        log.parent.mkdir()
        log.write_bytes(b"")
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds
            if pieces:
                with log.open("ab") as handle:
                    handle.write(pieces.pop(0))

        def state() -> JobState:
            return JobState("9", "RUNNING" if pieces else "FAILED")

        followed = list(logs.follow_lines(run, logs.Filter(), state, lambda: now[0], sleep))
        assert followed == list(logs.read_all(run, logs.Filter()))
        assert any(" lines folded (" in line for line in followed)


def test_a_rank_own_error_is_shown_while_the_job_still_runs(tmp_path: Path) -> None:
    run = _make_run(tmp_path, "10")
    log = run.logs_dir / "attempt-0" / "node1.err"
    log.parent.mkdir()
    written = _lines("rank1-raises", "node1")
    log.write_text("\n".join(written[: written.index(LAUNCHER_TRACEBACK)]) + "\n")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        assert now[0] < 60, "the job never ended"

    followed = logs.follow_lines(
        run, logs.Filter(), lambda: JobState("10", "RUNNING"), lambda: now[0], sleep
    )
    first = [next(followed) for _ in range(4)]
    assert first[-1] == "node1 rank1 ! ValueError: rank 1 gave up at step 20"
    assert now[0] <= 1.0  # within the follower's first cycles, not at the job's end


def test_the_cli_folds_unless_raw_and_status_names_the_error(tmp_path: Path) -> None:
    run = _job(tmp_path / "runs", "rank1-raises")
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    folded = run_cli("logs", run.job_id, env=env)
    raw = run_cli("logs", run.job_id, "--raw", env=env)
    followed = run_cli("logs", run.job_id, "--follow", env=env)
    status = run_cli("status", run.job_id, env=env)
    assert folded.returncode == raw.returncode == status.returncode == 0, folded.stderr
    written = sum(len((FIXTURES / "rank1-raises" / f).read_text().splitlines()) for f in
                  ("node1.out", "node1.err", "node2.out", "node2.err"))  # fmt: skip
    assert len(raw.stdout.splitlines()) == written
    assert len(folded.stdout.splitlines()) <= 15, folded.stdout
    assert "node1 rank1 ! ValueError: rank 1 gave up at step 20" in folded.stdout
    assert "38 lines folded (a launcher's failure report); see them with --raw or in " in (
        folded.stdout
    )
    # Following ends each file's last folded run when the job ends, after the other files.
    assert followed.returncode == 1
    # ... and the follower's last words are the cause, as status says it.
    assert followed.stderr.splitlines()[-3:-1] == [
        f"clustertrain: job {run.job_id} ended FAILED",
        "clustertrain: rank 1 on node1 raised ValueError: rank 1 gave up at step 20 "
        "(fail_rank.py:16)",
    ], followed.stderr
    assert followed.stderr.splitlines()[-1].startswith("clustertrain: hint: ")
    listed = run_cli("list", env=env).stdout.splitlines()
    assert listed[0].endswith(
        "  rank 1 on node1 raised ValueError: rank 1 gave up at step 20 (fail_rank.py:16)"
    ), listed
    refused = run_cli("status", run.job_id, "--why", "--json", env=env)
    assert refused.returncode == 2 and "--why: not with --json" in refused.stderr
    assert sorted(followed.stdout.splitlines()) == sorted(folded.stdout.splitlines())
    # The cause's headline first (clustertrain.runs.why), then the rank's traceback, its error
    # not said twice.
    assert "  rank 1 on node1 raised ValueError: rank 1 gave up at step 20 (fail_rank.py:16)" in (
        status.stdout
    )
    assert f"  evidence: clustertrain status {run.job_id} --why\n" in status.stdout
    # --why: the evidence, the consequences folded, within 20 lines.
    evidence = run_cli("status", run.job_id, "--why", env=env)
    assert evidence.returncode == 0, evidence.stderr
    said = evidence.stdout.splitlines()
    assert (
        said[1] == "  rank 1 on node1 raised ValueError: rank 1 gave up at step 20 "
        "(fail_rank.py:16)"
    ), said
    assert "    node1 rank1 ! ValueError: rank 1 gave up at step 20" in said
    assert said[3] == "  evidence:" and len(said) - 4 <= why.MAX_EVIDENCE
    assert not any("ChildFailedError" in line for line in said), said

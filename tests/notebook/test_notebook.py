"""notebook_launcher's checks and its reading back, without starting a job: what cannot be
pickled or is too large is named in one line with nothing queued; rank 0's value is unpickled
only from this run's sealed, private file; a failure names the first failing rank."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clustertrain import api, backends, protocol, runs
from clustertrain.errors import FieldError, UserError
from clustertrain.files import write_private
from clustertrain.jobstate import JobState
from clustertrain.notebook import JobFailed, _until_started, notebook_launcher, outcome
from clustertrain.rank.notebook import seal
from clustertrain.runs.why import Kind
from tests.conftest import run_cli

KEY = b"k" * 32


def in_a_notebook(source: str, **names: Any) -> Callable[..., Any]:
    """The function ``source`` defines, as a notebook's cell defines it: in ``__main__``, so that
    cloudpickle sends it by value, with what it uses (``names``) as its globals."""
    namespace: dict[str, Any] = {"__name__": "__main__", **names}
    exec(source, namespace)
    return next(v for k, v in namespace.items() if callable(v) and k not in names)


def _refused(tmp_path: Path, fn: Any, args: Any = (), **fields: Any) -> str:
    """notebook_launcher's one-line refusal; nothing written, nothing queued."""
    runs_dir = tmp_path / "runs"
    fields.setdefault("backend", "local")
    with pytest.raises(UserError) as refused:
        notebook_launcher(fn, args, runs_dir=str(runs_dir), **fields)
    assert not runs_dir.exists()
    said = str(refused.value)
    assert "\n" not in said
    return said


def test_a_lambda_over_an_open_file_is_named(tmp_path: Path) -> None:
    with open(tmp_path / "log.txt", "w") as log:
        said = _refused(tmp_path, lambda: log.write("x"))
    # cloudpickle's own words for why (a file open for writing) follow, in parentheses.
    assert said.startswith(
        "log (a variable of test_a_lambda_over_an_open_file_is_named.<locals>.<lambda>'s "
        "closure) cannot be pickled (PicklingError: "
    ), said
    assert said.endswith("); create it inside the function (open files there), or pass what "
                         "makes it (a path, a seed) instead")  # fmt: skip


def test_an_argument_or_a_global_that_cannot_be_pickled_is_named(tmp_path: Path) -> None:
    said = _refused(tmp_path, print, (1, (n for n in range(3))))
    assert said.startswith("args[1] cannot be pickled (TypeError: cannot pickle 'generator'")
    uses_a_lock = in_a_notebook(
        "def train():\n    with guard:\n        return 1\n", guard=threading.Lock()
    )
    said = _refused(tmp_path, uses_a_lock)
    assert said.startswith("guard (a global train uses) cannot be pickled (TypeError: "), said


def test_what_is_not_a_function_to_call_is_refused(tmp_path: Path) -> None:
    said = _refused(tmp_path, (n for n in range(3)))
    assert said.startswith("fn: invalid value <generator object") and "give the function" in said
    said = _refused(tmp_path, in_a_notebook("def steps():\n    yield 1\n"))
    assert said.startswith("fn: invalid value <function steps") and "return a list" in said
    said = _refused(tmp_path, print, "abc")
    assert said == "args: invalid value 'abc'; a tuple of fn's arguments, e.g. (config,)"


def test_a_call_over_max_bytes_names_its_largest_part(tmp_path: Path) -> None:
    train = in_a_notebook("def train(n):\n    return len(table) + n\n", table=bytes(3 << 20))
    said = _refused(tmp_path, train, (b"x" * 1000,), max_bytes=1 << 20)
    assert said.startswith("the call is 3.0 MiB pickled, over max_bytes (1.0 MiB); ")
    assert "table (a global train uses) is 3.0 MiB of it: load large data inside" in said
    assert said.endswith("or raise max_bytes")
    said = _refused(tmp_path, len, (b"x" * 10, bytes(2 << 20)), max_bytes=1 << 20)
    assert "; args[1] is 2.0 MiB of it:" in said


def test_fields_are_checked_as_submit_checks_them(tmp_path: Path) -> None:
    said = _refused(tmp_path, print, nodes=0)
    assert said.startswith("nodes: invalid value 0;")
    assert _refused(tmp_path, print, launcher="mpirun").startswith("launcher: invalid value")
    assert _refused(tmp_path, print, max_bytes=0).startswith("max_bytes: invalid value 0;")
    assert "once for each value" in _refused(tmp_path, print, sweep={"lr": [0.1, 0.2]})
    assert _refused(tmp_path, print, script="train.py").startswith("script: invalid value")
    said = _refused(tmp_path, print, backend="kubernetes")
    assert said == "backend: invalid value 'kubernetes'; one of slurm, local"


def _git_tree(tree: Path) -> Path:
    tree.mkdir()
    (tree / "train.py").write_text("print('hi')\n")
    for git in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                "commit", "-qm", "code"]):  # fmt: skip
        subprocess.run(["git", "-C", str(tree), *git], check=True, capture_output=True)
    return tree


def _recording_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``ssh`` first on PATH that keeps each call's words and stdin, says the code is there
    already, and cannot reach the host for anything else."""
    bin_dir, said = tmp_path / "bin", tmp_path / "said"
    bin_dir.mkdir()
    said.mkdir()
    (bin_dir / "ssh").write_text(
        f'#!/bin/sh\nn=$(ls {said} | grep -c words)\nprintf "%s\\n" "$@" > {said}/$n.words\n'
        f"cat > {said}/$n.stdin\ncase \"$*\" in *'test -e'*) exit 0;; esac\n"
        "echo 'ssh: connect to host login: No route to host' >&2\nexit 255\n"
    )
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    return said


def test_with_a_login_node_the_checked_fields_and_the_call_are_what_ssh_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(_git_tree(tmp_path / "tree"))
    said, runs_dir = _recording_ssh(tmp_path, monkeypatch), tmp_path / "runs"
    train = in_a_notebook("def train(n):\n    return n + 1\n")
    with pytest.raises(UserError, match=r"^host: login: cannot reach it \(ssh: connect to host"):
        notebook_launcher(
            train, (41,), host="login", nodes=2, procs_per_node=2, runs_dir=str(runs_dir),
            max_bytes=1 << 20, partition="--help", remote_clustertrain="/opt/ct/bin/clustertrain",
        )  # fmt: skip
    assert not runs_dir.exists()
    # The snapshot's check goes first (the code is there already), then the submission.
    words = [
        (said / f"{n}.words").read_text().splitlines()
        for n in range(len(list(said.glob("*.words"))))
    ]
    command = words[-1][-1]
    assert "/opt/ct/bin/clustertrain notebook-submit --partition=--help --name=train" in command
    assert "--nodes=2 --procs-per-node=2 --launcher=accelerate --max-bytes=1048576" in command
    call = pickle.loads((said / f"{len(words) - 1}.stdin").read_bytes())
    assert call["fn"](*call["args"]) == 42 and len(call["key"]) == 32


def test_a_login_node_outside_a_git_tree_or_with_a_local_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said, runs_dir = _recording_ssh(tmp_path, monkeypatch), tmp_path / "runs"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="git"):
        notebook_launcher(print, host="login", runs_dir=str(runs_dir))
    with pytest.raises(FieldError, match=r"^host: invalid value 'login'; a login node queues"):
        notebook_launcher(print, host="login", backend="local", runs_dir=str(runs_dir))
    with pytest.raises(FieldError, match=r"^host: invalid value '-oProxyCommand=x'"):
        notebook_launcher(print, host="-oProxyCommand=x", runs_dir=str(runs_dir))
    with pytest.raises(FieldError, match=r"^nodes: invalid value 0"):
        notebook_launcher(print, host="login", nodes=0, runs_dir=str(runs_dir))
    with pytest.raises(FieldError, match=r"^workdir: invalid value '/x'; with host the job runs"):
        notebook_launcher(print, host="login", workdir="/x", runs_dir=str(runs_dir))
    assert not runs_dir.exists() and not list(said.iterdir())


@pytest.mark.parametrize(
    ("words", "stdin", "line"),
    [
        (["--max-bytes=10"], b"x" * 11, "stdin: 11 bytes, not a call of 1 to 10 bytes"),
        (["--max-bytes=10"], b"", "stdin: 0 bytes, not a call of 1 to 10 bytes"),
        (
            ["--max-bytes=10", "--script=train.py"],
            b"x",
            "script: invalid value 'train.py'; the call",
        ),
        (["--max-bytes=10", "--sweep=lr=1,2"], b"x", "sweep: invalid value"),
        (["--max-bytes=10", "--replace-args"], b"x", "args: a notebook's call takes its"),
        (["--max-bytes=10", "--nodes=0"], b"x", "nodes: invalid value 0"),
    ],
)
def test_the_login_nodes_side_refuses_what_no_notebook_sends(
    tmp_path: Path, words: list[str], stdin: bytes, line: str
) -> None:
    runs_dir = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-P", "-m", "clustertrain", "notebook-submit", *words, "--runs-dir",
         str(runs_dir)], input=stdin, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    said = done.stderr.decode()
    assert done.returncode == 2, said
    assert said.startswith(f"clustertrain: error: {line}"), said
    assert len(said.splitlines()) == 1 and not runs_dir.exists()


def test_the_login_nodes_side_is_not_in_help() -> None:
    done = run_cli("--help")
    assert done.returncode == 0 and "notebook-submit" not in done.stdout


# Reading back ----------------------------------------------------------------------------------


@pytest.fixture
def job(tmp_path: Path) -> api.Job:
    """A recorded run of 2 ranks whose folder is as clustertrain wrote it, before any rank."""
    planned = api.plan(
        module="clustertrain.rank.notebook", procs_per_node=2, runs_dir=str(tmp_path / "runs"),
        node_record=False,
    )  # fmt: skip
    runs.write_run_files(planned)
    return api.Job(runs.record_submission(planned, "local-7", "local"), backends.named("local"))


COMPLETED = JobState("local-7", "COMPLETED")


class Planted:
    """What a pickle may do when it is loaded: here, create a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_rank_0s_sealed_value_comes_back(job: api.Job) -> None:
    write_private(job.run_dir / protocol.NOTEBOOK_RESULT, seal(KEY, pickle.dumps({"acc": 0.9})))
    assert outcome(job, COMPLETED, KEY, 1 << 20) == {"acc": 0.9}


def test_a_value_sealed_under_another_key_is_not_unpickled(job: api.Job, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    planted = seal(b"x" * 32, pickle.dumps(Planted(marker)))
    write_private(job.run_dir / protocol.NOTEBOOK_RESULT, planted)
    with pytest.raises(JobFailed, match="not written by this run's rank 0; it is not unpickled"):
        outcome(job, COMPLETED, KEY, 1 << 20)
    assert not marker.exists()
    write_private(job.run_dir / protocol.NOTEBOOK_RESULT, seal(KEY, pickle.dumps(Planted(marker))))
    outcome(job, COMPLETED, KEY, 1 << 20)
    assert marker.exists()  # the same file under this run's key is read: the check can fail


@pytest.mark.parametrize("how", ["mode", "symlink", "size", "missing"])
def test_a_result_file_others_could_write_or_too_large_is_refused(
    job: api.Job, tmp_path: Path, how: str
) -> None:
    result = job.run_dir / protocol.NOTEBOOK_RESULT
    write_private(result, seal(KEY, pickle.dumps(list(range(100)))))
    limit = 1 << 20
    if how == "mode":
        result.chmod(0o660)
    elif how == "symlink":
        result.rename(tmp_path / "elsewhere")
        result.symlink_to(tmp_path / "elsewhere")
    elif how == "size":
        limit = 100
    else:
        result.unlink()
    with pytest.raises(JobFailed, match=r"^job local-7 COMPLETED without rank 0's return value: "):
        outcome(job, COMPLETED, KEY, limit)


def _error(job: api.Job, rank: int, when: float, error: str) -> None:
    record = {"rank": rank, "node": f"node{rank + 1}", "time": when, "error": error}
    name = protocol.NOTEBOOK_ERROR.format(rank=rank)
    write_private(job.run_dir / name, json.dumps(record).encode())


def test_a_failure_names_the_first_rank_that_failed_and_its_error(job: api.Job) -> None:
    _error(job, 0, 200.0, "RuntimeError: a peer is gone")
    _error(job, 1, 100.5, "ValueError: boom")
    with pytest.raises(JobFailed) as failed:
        outcome(job, JobState("local-7", "FAILED"), KEY, 1 << 20)
    assert str(failed.value) == (
        "job local-7 ended FAILED: rank 1 on node2 failed first: ValueError: boom "
        "(its lines: clustertrain logs local-7 --rank 1)"
    )
    assert failed.value.rank == 1 and failed.value.job is job


def test_a_forged_error_file_is_skipped_and_without_any_the_state_is_said(job: api.Job) -> None:
    (job.run_dir / protocol.NOTEBOOK_ERROR.format(rank=0)).write_text("[not a record")
    _error(job, 1, 1.0, "ValueError: boom")
    os.rename(
        job.run_dir / protocol.NOTEBOOK_ERROR.format(rank=1),
        job.run_dir / protocol.NOTEBOOK_ERROR.format(rank=5),  # not a rank of this job
    )
    state = JobState("local-7", "FAILED", reason="NonZeroExitCode")
    with pytest.raises(JobFailed) as failed:
        outcome(job, state, KEY, 1 << 20)
    assert str(failed.value) == (
        "job local-7 ended FAILED (NonZeroExitCode); its lines: clustertrain logs local-7"
    )


def test_a_job_that_ran_out_of_time_raises_the_cause_status_prints(job: api.Job) -> None:
    state = JobState("local-7", "TIMEOUT", reason="TimeLimit")
    with pytest.raises(JobFailed) as failed:
        outcome(job, state, KEY, 1 << 20)
    assert str(failed.value) == (
        "job local-7 ended TIMEOUT: reached its time limit (Slurm: TIMEOUT) "
        "(its lines: clustertrain logs local-7)"
    )
    cause = failed.value.cause
    assert cause is not None and cause.kind is Kind.TIME_LIMIT
    assert cause.headline == job.status(state=state).lines()[0]


def test_a_cancelled_job_is_said_cancelled_not_a_ranks_failure(job: api.Job) -> None:
    _error(job, 1, 1.0, "KeyboardInterrupt")
    with pytest.raises(JobFailed) as failed:
        outcome(job, JobState("local-7", "CANCELLED+"), KEY, 1 << 20)
    assert str(failed.value) == "job local-7 ended CANCELLED+; its lines: clustertrain logs local-7"
    assert failed.value.rank is None


class Waiting:
    """A job whose state goes through ``states``; its progress lines land in ``said``."""

    job_id = "42"

    def __init__(self, *states: tuple[str, str]) -> None:
        self.states = [JobState("42", state, reason=reason) for state, reason in states]

    def job_state(self) -> JobState:
        return self.states.pop(0)


def test_queueing_is_said_when_it_changes_and_every_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = Waiting(
        ("PENDING", "Priority"), ("PENDING", "Priority"), ("PENDING", "Priority"),
        ("PENDING", "Resources"), ("CONFIGURING", ""), ("RUNNING", ""),
    )  # fmt: skip
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += 30.0

    import sys

    state = _until_started(job, sys.stdout, lambda: now[0], sleep)  # type: ignore[arg-type]
    assert state.state == "RUNNING"
    assert capsys.readouterr().out.splitlines() == [
        "clustertrain: job 42 PENDING (Priority), 0 s since it was queued",
        "clustertrain: job 42 PENDING (Priority), 60 s since it was queued",
        "clustertrain: job 42 PENDING (Resources), 90 s since it was queued",
        "clustertrain: job 42 CONFIGURING, 120 s since it was queued",
    ]

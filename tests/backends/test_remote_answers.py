"""A login node's answers are input (issue 49): each is read up to a cap of its kind (a state,
a job record, the files to fetch, a submission's lines, a line of logs) and refused in one line
past it, never held whole; and every line of it clustertrain prints here has its control
characters escaped (a host cannot retitle or clear the terminal). ssh is a script here."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.backends import remote
from clustertrain.backends.remote import record, request, stream
from clustertrain.errors import UserError
from tests.backends.test_remote import _remote_run, _scripted_ssh
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
ENDLESS = "exec yes 'an answer that never ends'"  # far past any cap, at pipe speed
TITLE = "\x1b]0;pwned\x07"


@pytest.fixture
def endless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's ``ssh`` answers without end."""
    env = _scripted_ssh(tmp_path, ENDLESS)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("HOME", env["HOME"])
    return tmp_path


def _quick(call: object) -> str:
    """The refusal of ``call``, which an endless answer must end (ssh killed at the cap)."""
    with pytest.raises(UserError) as refused:
        call()  # type: ignore[operator]
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_state_past_its_cap_is_one_line(endless: Path) -> None:
    backend = remote.RemoteBackend(remote.Remote("login", "/home/u/runs/r-1", "clustertrain"))
    said = _quick(lambda: backend.state(None))  # type: ignore[arg-type]
    assert said == "host: login: status: more than 1048576 bytes; refused"


def test_a_job_record_past_its_cap_is_one_line_and_nothing_is_written(endless: Path) -> None:
    runs = endless / "runs"
    found = remote.Remote("login", "/home/u/.clustertrain/runs/mnist-1", "clustertrain")
    said = _quick(lambda: record.record_here(found, runs))
    assert said == f"host: login: its job record: more than {record.RECORD_BYTES} bytes; refused"
    assert not runs.exists()


@pytest.mark.parametrize("folder", ["/r/..", "/r/\x1b]0;x", "/r/" + "x" * 300, "/r/-x", "/r/"])
def test_a_run_folder_name_a_host_says_is_checked_before_it_is_asked(
    folder: str, endless: Path
) -> None:
    runs = endless / "runs"
    said = _quick(lambda: record.record_here(remote.Remote("login", folder, "ct"), runs))
    assert "which is not the name of a clustertrain run folder" in said and "\x1b" not in said
    assert not (endless / "calls").exists() and not runs.exists()


def test_files_to_fetch_past_the_limit_are_one_line(endless: Path) -> None:
    here = endless / "run"
    here.mkdir()
    found = remote.Remote("login", "/home/u/runs/r-1", "clustertrain")
    said = _quick(lambda: stream.fetch(found, here, limit=1 << 20))
    assert said == "host: login: the files to fetch: more than 1048576 bytes; refused"
    assert list(here.iterdir()) == []


def test_a_submission_that_never_stops_talking_is_stopped(
    endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(request, "SAID_BYTES", 1 << 20)
    argv = remote.ssh.argv("login", ["clustertrain", "submit"])
    said = _quick(lambda: request._stream(argv, lambda line: None))
    assert said == "host: its answer to the submission: more than 1048576 bytes; stopped"


def test_a_submissions_lines_are_echoed_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _scripted_ssh(tmp_path, f"printf 'prepare: {TITLE}done\\n'")["PATH"])
    said: list[str] = []
    request._stream(remote.ssh.argv("login", ["true"]), said.append)
    assert said == ["prepare: \\x1b]0;pwned\\x07done"]


def test_status_and_logs_of_a_remote_run_print_the_hosts_words_escaped(tmp_path: Path) -> None:
    run = _remote_run(tmp_path)
    script = f"printf 'job 42 (mnist): RUNNING {TITLE}\\n[node1 rank 0] \\033[2J\\n'; "
    script += f"printf 'oops {TITLE}\\n' >&2"
    env = {**_scripted_ssh(tmp_path, script), "PYTHONPATH": str(ROOT)}
    for command in ("status", "logs", "results"):
        done = run_cli(command, "42", "--runs-dir", str(run.parent), env=env, timeout=60)
        assert "\x1b" not in done.stdout + done.stderr, (command, done.stdout, done.stderr)
        assert "\\x1b]0;pwned\\x07" in done.stdout + done.stderr, command


def test_a_line_of_logs_without_end_is_printed_in_pieces(tmp_path: Path) -> None:
    run = _remote_run(tmp_path)
    script = "[ $n = 1 ] && exit 0; head -c 3000000 /dev/zero | tr '\\0' x; echo"
    env = {**_scripted_ssh(tmp_path, script), "PYTHONPATH": str(ROOT)}
    done = run_cli("logs", "--follow", "42", "--runs-dir", str(run.parent), env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-300:]
    assert [len(line) for line in done.stdout.splitlines()] == [
        stream.LINE_BYTES,
        stream.LINE_BYTES,
        3000000 - 2 * stream.LINE_BYTES,
    ]

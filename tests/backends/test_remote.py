"""Submitting over ssh, what needs no host: refusals before anything is sent, the snapshot of a
git tree (real git, temporary trees), and the command line passed on to the login node."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import clustertrain
from clustertrain.backends import remote
from clustertrain.backends.remote import request as remote_request
from clustertrain.backends.remote import snapshot
from clustertrain.errors import FieldError, UserError
from clustertrain.jobstate import JobState
from tests.conftest import run_cli


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "train.py").write_text("print('hi')\n")
    (tree / "sub" / "job.yaml").write_text("nodes: 1\nscript: train.py\n")
    (tree / ".gitignore").write_text("secret.env\n")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    return tree


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=touch /tmp/x", "login node", "login\n", "lo\x1bgin"]
)
def test_a_host_that_could_be_an_option_or_hides_words_is_refused(
    host: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    done = run_cli("submit", "--host", host, env={"CLUSTERTRAIN_RUNS_DIR": str(runs)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("clustertrain: error: host: ")
    assert len(done.stderr.splitlines()) == 1 and not runs.exists()


def test_doctor_refuses_a_host_that_could_be_an_option() -> None:
    done = run_cli("doctor", "--host", "-oProxyCommand=x")
    assert done.returncode == 2 and done.stderr.startswith("clustertrain: error: host: ")


def test_an_unreachable_host_is_one_line_and_nothing_is_written(tree: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = run_cli(
        "submit", "--host", "nohost.invalid", "--script", "train.py", cwd=tree,
        env={"CLUSTERTRAIN_RUNS_DIR": str(runs), "HOME": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("clustertrain: error: host: nohost.invalid: cannot reach it (")
    assert len(done.stderr.splitlines()) == 1 and not runs.exists()


def test_a_bad_field_is_refused_here_before_the_host_is_asked(tmp_path: Path) -> None:
    done = run_cli("submit", "--host", "nohost.invalid", "--nodes", "0", timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(
        "clustertrain: error: nodes: invalid value 0"
    )


def test_a_dirty_tree_is_refused_naming_its_changes(tree: Path) -> None:
    (tree / "train.py").write_text("print('changed')\n")
    (tree / "new.py").write_text("")
    (tree / "secret.env").write_text("TOKEN=1\n")  # ignored: neither listed nor sent
    with pytest.raises(UserError) as refused:
        snapshot.take(tree / "sub")
    said = str(refused.value)
    assert said.startswith("working tree: 2 uncommitted change(s) in ")
    assert "new.py" in said and "train.py" in said and "secret.env" not in said
    assert said.endswith("commit them, or send the files as they are with --allow-dirty")


def test_a_snapshot_is_the_trees_content_and_never_an_ignored_file(tree: Path) -> None:
    clean = snapshot.take(tree / "sub")
    assert clean.prefix == "sub/" and clean.files is None
    assert clean.digest == snapshot.take(tree).digest  # the tree, wherever one submits from
    (tree / "secret.env").write_text("TOKEN=1\n")
    assert snapshot.take(tree).digest == clean.digest  # ignored files change nothing
    (tree / "new.py").write_text("x = 1\n")
    dirty = snapshot.take(tree, allow_dirty=True)
    assert dirty.digest != clean.digest
    assert dirty.digest == snapshot.take(tree, allow_dirty=True).digest  # the same files: same
    listing = subprocess.run(
        ["tar", "-t"], input=dirty.archive(), capture_output=True, check=True
    ).stdout.decode()
    assert sorted(listing.split()) == [".gitignore", "new.py", "sub/job.yaml", "train.py"]


def test_outside_a_git_tree_it_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not in a git tree.*git init"):
        snapshot.take(tmp_path)


def test_the_cli_sends_the_login_node_the_checked_values_as_flags_and_no_option_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One road: ``submit --host`` is ``api.submit(host=...)``, which says each checked field
    again as one ``--flag=VALUE`` word; this side's options stay here, the script's args pass."""
    from clustertrain.cli.commands import main

    sent: list[Any] = []
    _fake_login_node(monkeypatch, tmp_path, sent)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    given = ["submit", "--script", "train.py", "--host", "login", "--nodes", "2", "--allow-dirty"]
    given += ["--env", "A=-x y", "--runs-dir", str(tmp_path / "r"), "--", "--host", "kept"]
    with pytest.raises(SystemExit) as ended:
        main(given)
    assert ended.value.code == 0
    assert [(asked.host, list(asked.words)) for asked, _ in sent] == [
        ("login", ["--script=train.py", "--nodes=2", "--env=A=-x y", "--", "--host", "kept"])
    ]


def test_the_api_refuses_a_host_that_could_be_an_option_and_writes_nothing(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(UserError, match=r"^host: "):
        clustertrain.submit(host="-oProxyCommand=x", script="train.py", runs_dir=str(runs))
    with pytest.raises(FieldError, match=r"^nodes: "):  # a bad field, before any host is asked
        clustertrain.submit(host="nohost.invalid", nodes=0, runs_dir=str(runs))
    assert not runs.exists()


def test_the_api_hands_the_login_node_the_command_line_its_fields_make(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``submit(host=...)`` passes on (the login node's clustertrain is faked here; the
    real one reads it in tests/e2e/test_remote_e2e.py)."""
    sent: list[Any] = []
    _fake_login_node(monkeypatch, tree.parent / "queued", sent)
    monkeypatch.chdir(tree)
    monkeypatch.setenv("CLUSTERTRAIN_HOST", "login")
    got = clustertrain.submit(
        str(tree / "sub" / "job.yaml"), nodes=2, env={"A": "1"}, skip_prepare=True,
        extra_args=["--epochs", "1"], remote_clustertrain="/opt/ct", preflight=False,
    )  # fmt: skip
    assert isinstance(got, clustertrain.Job) and got.backend.name == "ssh"
    passed = [(r.host, list(r.words), here, r.clustertrain) for r, here in sent]
    host, words, here, ct = passed[0]
    assert (host, here, ct) == ("login", tree, "/opt/ct")
    assert words == [
        "sub/job.yaml", "--nodes=2", "--env=A=1", "--no-prepare", "--no-preflight", "--",
        "--epochs", "1",
    ]  # fmt: skip
    clustertrain.submit(script="train.py", args=["--lr", "1"], extra_args=["-v"], dry_run=True)
    assert list(sent[1][0].words) == [
        "--script=train.py",
        "--dry-run",
        "--replace-args",
        "--",
        "--lr",
        "1",
        "-v",
    ]


STATES = [
    JobState("42", "RUNNING", nodes="n[1-2]", elapsed="0:05", restarts=1),
    JobState("42_3", "CANCELLED+", exit_code="0:15", reason="None"),
    JobState("40", "RUNNING", tasks=((0, "COMPLETED"), (1, "PENDING"))),
    JobState("local-123", "COMPLETED", source="local"),
    JobState("43", "FAILED", exit_code="1:0", reason="its supervisor ended", source="run folder"),
]


@pytest.mark.parametrize("state", STATES, ids=[s.job_id for s in STATES])
def test_a_state_said_as_json_reads_back_as_itself(state: JobState) -> None:
    assert JobState.from_dict(json.loads(json.dumps(state.as_dict()))) == state


BAD_STATES: list[Any] = [
    [],
    {"state": "RUNNING"},  # no job id
    {"job_id": "42; scancel -u root", "state": "RUNNING"},
    {"job_id": "-u", "state": "RUNNING"},
    {"job_id": "42", "state": "running now"},
    {"job_id": "42", "state": "RUNNING", "restarts": True},
    {"job_id": "42", "state": "RUNNING", "restarts": -1},
    {"job_id": "42", "state": "RUNNING", "reason": "\x1b[2Jgone"},
    {"job_id": "42", "state": "RUNNING", "nodes": "n" * 2000},
    {"job_id": "42", "state": "RUNNING", "tasks": [[0, "RUNNING", "x"]]},
    {"job_id": "42", "state": "RUNNING", "tasks": [["0", "RUNNING"]]},
    {"job_id": "42", "state": "RUNNING", "owner": "root"},  # a field it does not know
    {"job_id": "42", "state": "RUNNING", "source": "rumour"},
]


@pytest.mark.parametrize("data", BAD_STATES)
def test_a_state_that_is_not_one_is_refused(data: Any) -> None:
    with pytest.raises(ValueError, match="bad|not a job state"):
        JobState.from_dict(data)


def test_a_login_nodes_answer_that_is_no_state_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = subprocess.CompletedProcess([], 0, b'{"job_id": "42", "state": "$(reboot)"}\n', b"")
    monkeypatch.setattr(remote.ssh, "run", lambda *a, **k: said)
    backend = remote.RemoteBackend(remote.Remote("login", "/home/u/runs/r", "clustertrain"))
    with pytest.raises(UserError, match=r"^host: login: status said no job state \(bad state"):
        backend.state(None)  # type: ignore[arg-type]


def test_the_api_refuses_a_workdir_with_a_host(tmp_path: Path) -> None:
    with pytest.raises(FieldError, match="^workdir: .*leave workdir out"):
        clustertrain.submit(host="login", workdir="/x", nodes=1, runs_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_a_job_file_outside_the_snapshot_is_refused_before_anything_is_sent(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login node would read whatever is at that path on its own disk (anyone's, on a
    shared login node), and run its prepare commands as you."""

    sent: list[Any] = []
    _fake_login_node(monkeypatch, tmp_path / "queued", sent)
    outside = tmp_path / "planted.yaml"
    outside.write_text("nodes: 1\nscript: train.py\n")
    monkeypatch.chdir(tree)
    with pytest.raises(UserError, match=r"^job file: .*planted.yaml is outside the git tree"):
        clustertrain.submit(str(outside), host="login", runs_dir=str(tmp_path / "runs"))
    clustertrain.submit("sub/job.yaml", host="login", runs_dir=str(tmp_path / "runs"))
    assert len(sent) == 1 and sent[0][0].words[0] == "sub/job.yaml"


def _fake_login_node(monkeypatch: pytest.MonkeyPatch, where: Path, sent: list[Any]) -> None:
    """The login node's clustertrain, faked: each request it is sent, with the directory whose
    tree it would take, is kept in ``sent``; a submission comes back as a run recorded under
    ``where``, a dry run as None."""
    from clustertrain import runs

    def fake(asked: remote.Request, here: Path, root: Path, echo: Any) -> Any:
        sent.append((asked, here))
        return None if asked.dry_run else runs.read_run(_remote_run(where))

    monkeypatch.setattr(remote_request, "queue", fake)


def _remote_run(tmp_path: Path) -> Path:
    """A run folder of a job queued through the login node ``login``."""
    from clustertrain import protocol, runs
    from clustertrain.render import render
    from tests.conftest import job_spec

    root = tmp_path / "runs"
    job = render(job_spec(name="mnist", nodes=2), str(runs.new_run_dir(root, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "42", "slurm")
    record = {"host": "login", "run_dir": "/r/mnist-1", "clustertrain": "ct"}
    (run.path / protocol.REMOTE_FILE).write_text(json.dumps(record))
    return run.path


def _scripted_ssh(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose ``ssh`` is ``script`` (sh), which counts its calls in ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        f"#!/bin/sh\ncd {tmp_path}\necho x >> calls\nn=$(wc -l < calls)\n{script}\n"
    )
    (bin_dir / "ssh").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}


def test_following_a_host_that_cannot_be_reached_is_one_line_at_once(tmp_path: Path) -> None:
    run = _remote_run(tmp_path)
    env = _scripted_ssh(tmp_path, "echo 'ssh: Could not resolve hostname login' >&2\nexit 255")
    done = run_cli("logs", "--follow", "42", "--runs-dir", str(run.parent), env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "clustertrain: error: host: login: cannot reach it (ssh: Could not resolve hostname "
        "login); check that `ssh login` works"
    ]
    assert (tmp_path / "calls").read_text().count("x") == 1  # asked once, never again


def test_a_dropped_connection_is_made_again_and_no_line_comes_twice(tmp_path: Path) -> None:
    # 1: the first knock; 2: two lines, then the link drops; 3: a knock that fails; 4: one that
    # answers; 5: the whole log again, now with its third line, and the job's end.
    script = """case $n in
      2) printf '[node1 rank 0] a\\n[node1 rank 0] b\\n'; exit 255;;
      3) exit 255;;
      5) printf '[node1 rank 0] a\\n[node1 rank 0] b\\n[node1 rank 0] c\\n'; exit 0;;
    esac"""
    run = _remote_run(tmp_path)
    env = _scripted_ssh(tmp_path, script)
    done = run_cli("logs", "--follow", "42", "--runs-dir", str(run.parent), env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"[node1 rank 0] {c}" for c in "abc"]
    assert done.stderr.splitlines() == [
        "clustertrain: the connection to login dropped; connecting again (for up to 60 s)"
    ]
    assert (tmp_path / "calls").read_text().count("x") == 5

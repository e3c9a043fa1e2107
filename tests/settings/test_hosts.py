"""Your hosts file (clustertrain.settings.hosts) and the clustertrain it names for a login node:
which value wins, and every bad file or value refused in one line before any ssh runs (a fake
``ssh`` first on PATH says whether one ran). The real login node reads it in
tests/e2e/test_remote_e2e.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clustertrain import protocol, runs
from clustertrain.errors import FieldError
from clustertrain.render import render
from clustertrain.settings import hosts
from tests.conftest import job_spec, run_cli


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$XDG_CONFIG_HOME of this test, with no hosts file yet (where it would be, returned)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("CLUSTERTRAIN_HOSTS_FILE", raising=False)
    monkeypatch.delenv("CLUSTERTRAIN_REMOTE_CLUSTERTRAIN", raising=False)
    path = tmp_path / "config" / "clustertrain" / "hosts.yaml"
    path.parent.mkdir(parents=True)
    return path


def test_the_flag_then_the_environment_then_the_file_then_the_default(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hosts.clustertrain_for("login") == "clustertrain"  # no file: the login shell's PATH
    config.write_text("login:\n  remote_clustertrain: /opt/ct/bin/clustertrain\nother: {}\n")
    assert hosts.clustertrain_for("login") == "/opt/ct/bin/clustertrain"
    assert hosts.clustertrain_for("other") == "clustertrain"
    assert hosts.clustertrain_for("elsewhere") == "clustertrain"
    monkeypatch.setenv("CLUSTERTRAIN_REMOTE_CLUSTERTRAIN", "/env/ct")
    assert hosts.clustertrain_for("login") == "/env/ct"
    assert hosts.clustertrain_for("login", "/flag/ct") == "/flag/ct"


def test_a_named_hosts_file_is_read_and_must_exist(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "mine.yaml"
    named.write_text("login: {remote_clustertrain: /home/me/venv/bin/clustertrain}\n")
    monkeypatch.setenv("CLUSTERTRAIN_HOSTS_FILE", str(named))
    assert hosts.clustertrain_for("login") == "/home/me/venv/bin/clustertrain"
    named.unlink()
    with pytest.raises(FieldError, match=r"^CLUSTERTRAIN_HOSTS_FILE: .*no such file"):
        hosts.clustertrain_for("login")


# (the file's text, the field the one line names ("{path}": the file), what it says of it)
BAD_FILES = [
    ("login: {remote_clustertrain: -a}\n", "{path}: login.remote_clustertrain", "'-a'; name"),
    (
        'login: {remote_clustertrain: "/ct\\nrm -rf ~"}\n',
        "{path}: login.remote_clustertrain",
        "'/ct\\n",
    ),
    ("login: {remote_clustertrain: ~/venv/ct}\n", "{path}: login.remote_clustertrain", "absolute"),
    ("login: {remote_clustertrain: [/a, /b]}\n", "{path}: login.remote_clustertrain", "['/a', "),
    ("login: {clustertrain: /opt/ct}\n", "{path}: login.clustertrain", "not a host setting"),
    ("login: /opt/ct\n", "{path}: login", "'/opt/ct'; must be a mapping of settings"),
    ('"-oProxyCommand=x": {remote_clustertrain: /ct}\n', "{path}: host", "'-oProxyCommand=x'"),
    ("true: {remote_clustertrain: /ct}\n", "{path}: host", "True; must be a host name"),
    ("- login\n", "hosts file", "must map host names to settings"),
    ("a: &x {remote_clustertrain: /ct}\nb: *x\n", "hosts file", "uses YAML anchors"),
    ("login: [\n", "hosts file", "is not valid YAML at line 2"),
    ("login: {}\nlogin: {}\n", "login", "'(twice)'; a YAML file may set each key once"),
]


def _fake_ssh(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``ssh`` only leaves a mark, and the mark."""
    bin_dir, mark = tmp_path / "bin", tmp_path / "ssh-ran"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\ntouch {mark}\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, mark


@pytest.mark.parametrize(("text", "field", "said"), BAD_FILES)
def test_a_bad_hosts_file_is_one_line_and_nothing_is_sent_or_written(
    config: Path, tmp_path: Path, text: str, field: str, said: str
) -> None:
    config.write_text(text)
    fake, mark = _fake_ssh(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**fake, "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    for command in (["submit", "--script", "train.py"], ["doctor"]):
        done = run_cli(*command, "--host", "login", cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        line = f"clustertrain: error: {field.format(path=config)}: invalid value "
        assert done.stderr.startswith(line) and said in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
    assert not mark.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["-a", "--version", "ct\x1b[2J", "", "~/ct", "venv/bin/ct"])
def test_a_remote_clustertrain_that_is_an_option_or_hides_text_is_refused(
    config: Path, tmp_path: Path, value: str
) -> None:
    fake, mark = _fake_ssh(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**fake, "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    submit = ["submit", "--host", "login", "--script", "train.py"]
    tries = [(submit + ["--remote-clustertrain", value], env), (["doctor", "--host", "login",
             f"--remote-clustertrain={value}"], env)]  # fmt: skip
    if value:  # an empty variable is no choice (below)
        tries.append((submit, {**env, "CLUSTERTRAIN_REMOTE_CLUSTERTRAIN": value}))
    for command, given in tries:
        done = run_cli(*command, cwd=tmp_path, env=given)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("clustertrain: error: remote_clustertrain: invalid value")
        assert len(done.stderr.splitlines()) == 1
    assert not mark.exists() and not (tmp_path / "runs").exists()


def test_an_empty_variable_leaves_the_choice_to_the_file(config: Path, tmp_path: Path) -> None:
    config.write_text("login: {remote_clustertrain: /opt/ct/bin/clustertrain}\n")
    fake, mark = _fake_ssh(tmp_path)
    done = run_cli(
        "doctor", "--host", "login", env={**fake, "CLUSTERTRAIN_REMOTE_CLUSTERTRAIN": ""}
    )
    assert mark.exists()  # it went on to ssh, which (fake) could not reach the host
    assert done.returncode == 2 and "host: login: cannot reach it" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "record",
    [
        {"host": "-oProxyCommand=touch /tmp/x", "run_dir": "/r/x", "clustertrain": "ct"},
        {"host": "login", "run_dir": "/r/x", "clustertrain": "-a"},
        {"host": "login", "run_dir": "r/x", "clustertrain": "ct"},
        {"host": "login", "run_dir": "/r/x\n; reboot", "clustertrain": "ct"},
        {"host": "login", "run_dir": "/r/x", "clustertrain": "ct", "then": "reboot"},
        # The folder's name is the JOB argument there: an option, or another folder.
        {"host": "login", "run_dir": "/r/--help", "clustertrain": "ct"},
        {"host": "login", "run_dir": "/r/..", "clustertrain": "ct"},
        {"host": "login", "run_dir": "/r/x/", "clustertrain": "ct"},
        "not a record",
    ],
)
def test_a_run_folders_remote_record_that_could_act_is_refused_before_ssh(
    tmp_path: Path, record: object
) -> None:
    """``remote.json`` is read back from a run folder, which anything may have written."""
    root = tmp_path / "runs"
    job = render(job_spec(name="mnist", nodes=2), str(runs.new_run_dir(root, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "42", "slurm")
    (run.path / protocol.REMOTE_FILE).write_text(json.dumps(record))
    fake, mark = _fake_ssh(tmp_path)
    for command in ("status", "cancel", "logs"):
        done = run_cli(command, "42", "--runs-dir", str(root), env=fake)
        assert done.returncode == 2, done.stdout + done.stderr
        assert (
            done.stderr.startswith("clustertrain: error: ") and len(done.stderr.splitlines()) == 1
        )
    assert not mark.exists()

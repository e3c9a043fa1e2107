"""Hostile input, round two: the parsers a value meets after bash.

sbatch's own ``#SBATCH`` parser (checked against the real sbatch of the local cluster), the
variables the scripts read themselves, YAML 1.1's implicit scalars, run folders as input, and
a Slurm that cannot be reached. Each value is refused (exit 2, one line naming the field,
nothing written, sbatch never called) or reaches its reader exactly as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain import api, protocol, runs
from clustertrain.rank import events
from clustertrain.render import render
from tests.cli import test_hostile_input as round_one
from tests.cli.test_hostile_input import _assert_refused
from tests.conftest import job_spec, run_cli
from tests.e2e.test_slurm_e2e import cluster  # noqa: F401  (a fixture)

# 1. sbatch's parser: abbreviations, negations, options clustertrain owns, its own escapes.
SBATCH_REFUSED: list[tuple[list[str], str]] = [
    *[
        (["--sbatch-option", option], "sbatch_options")
        for option in [
            "--outp=/tmp/evil",  # --output, abbreviated
            "--out=/tmp/evil",
            "--er=/tmp/evil",
            "--nod=3",
            "--job=evil",
            "--chd=/tmp",
            "--res=maint",  # even a harmless option must be spelled in full
            "--no-requeue",
            "--requeue",
            "--wrap=touch PWNED",
            "--export=ALL,LD_PRELOAD=/tmp/x.so",
            "--export-file=/tmp/env",
            "--array=0-9",
            "--output=/tmp/evil",
            "--error=/tmp/evil",
            "--input=/etc/shadow",
            "--open-mode=truncate",
            "--signal=KILL@1",
            "--nodes=3",
            "--gpus=64",
            "--partition=other",
            "--account=other",
            "--get-user-env",
            "--parsable",
            "--wait",
            "--test-only",
            "--comment=a\\b",
            '--comment=a"b',
            "--comment=a\\ --output=/tmp/evil",
            "--comment=x\x1b[2J",
            "--not-an-option=1",
            "--part=other",
            "--acc=other",
            "--tim=5",
            "--sig=USR1@10",
            "--op=append",
            "-o/tmp/evil",
        ]
    ],
    (["--name", "x\\ --output=/tmp/evil"], "name"),
    (["--name", 'a" --nodes=3 "'], "name"),
    (["--name", "a\\"], "name"),
]

# Values sbatch must read exactly as written (held jobs compare scontrol show job).
SBATCH_LITERAL_NAMES = [
    "my job",
    "a #comment",
    "it's",
    "x --output=/tmp/evil",
    "$(touch PWNED)",
    "a'b'c",
    "--nodes=3",
    "tab-free; id",
]
SBATCH_LITERAL_COMMENTS = ["--nodes=3 --outp=/tmp/evil", "c#d", "it's here", "$(id) `id`"]

# 2. The variables the scripts, Slurm, the launchers and bash read themselves.
RESERVED_ENV = [
    "SLURM_JOB_ID",  # RDZV_PORT=$(( ... SLURM_JOB_ID ... )): bash arithmetic runs a[$(cmd)]
    "SLURM_RESTART_COUNT",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURMD_NODENAME",
    "SRUN_CPUS_PER_TASK",
    "SBATCH_ACCOUNT",
    "SALLOC_PARTITION",
    "CLUSTERTRAIN_REQUEUE_FILE",
    "CLUSTERTRAIN_OUT_DIR",
    "CLUSTERTRAIN_RUN_DIR",
    "CLUSTERTRAIN_RDZV_TIMEOUT_S",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    "HEAD_NODE",
    "RDZV_PORT",
    "RDZV_IS_HOST",
    "LOG_DIR",
    "STATUS",
    "SRUN_PID",
    "PATH",
    "VIRTUAL_ENV",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "BASH_ENV",
    "bash_env",
    "BASH_XTRACEFD",
    "BASH_FUNC_x%%",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "IFS",
    "PS4",
    "PROMPT_COMMAND",
    "GLOBIGNORE",
    "CDPATH",
    "UID",
    "EUID",
    "PPID",
    "SECONDS",
]

# 3. YAML 1.1 scalars in job files: (text, field refused). Numbers where text is meant are read
# as their text instead (below).
YAML_REFUSED: list[tuple[str, str]] = [
    # Readers that were not bounded: an explicit !!int of 5,000 hex digits (its repr raised),
    # one of 5,000 decimal digits (over Python's limit), keys that are lists or mappings.
    ("nodes: !!int 0x" + "f" * 5000 + "\n", "nodes"),
    ("nodes: !!int " + "9" * 5000 + "\n", "job file"),
    ("? [1, 2]\n: 3\n", "job file"),
    ("{a: 1}: 2\n", "job file"),
    ("nodes: 010\n", "nodes"),
    ("nodes: 0x10\n", "nodes"),
    ("nodes: 0o10\n", "nodes"),
    ("nodes: 1_000\n", "nodes"),
    ("nodes: 2:00\n", "nodes"),
    ("nodes: 4.0\n", "nodes"),
    ("nodes: " + "9" * 5000 + "\n", "nodes"),
    ("gpus_per_node: +2\n", "gpus_per_node"),
    ("max_restarts: 1e2\n", "max_restarts"),
    ("rdzv_timeout_s: .5\n", "rdzv_timeout_s"),
    ("exclusive: yes\n", "exclusive"),
    ("exclusive: on\n", "exclusive"),
    ("node_check: off\n", "node_check"),
    ("exclusive: 'true'\n", "exclusive"),
    ("nodes: 1\nnodes: 2\n", "nodes"),
    ("env: {A: '1', A: '2'}\n", "A"),
    ("name: &n x\n", "job file"),
    ("args: &a [x]\n", "job file"),
    ("args: [~]\n", "args[0]"),
    ("args: [true]\n", "args[0]"),
    ("env: {A: on}\nexclusive: 1\n", "exclusive"),
    ("env: {A: false}\n", "env.A"),
    ("time: 1.5\n", "time"),
    ("nodes: 0b11\n", "nodes"),
    ("nodes: !!float 2\n", "nodes"),
    ("exclusive: Yes\n", "exclusive"),
    ("max_requeues: 0x3\n", "max_requeues"),
    ("procs_per_node: 08\n", "procs_per_node"),
]
# (job file text, what the dry run must show)
YAML_AS_TEXT: list[tuple[str, str]] = [
    ("time: 30:00\n", "#SBATCH --time=00:30:00\n"),  # YAML 1.1: 1800, i.e. 30 hours
    ("time: 1:30:00\n", "#SBATCH --time=01:30:00\n"),
    ("time: 90\n", "#SBATCH --time=01:30:00\n"),
    ("nodes: 10\n", "#SBATCH --nodes=10\n"),
    ("args: [--lr, 1.10]\n", "    --lr 1.10\n"),
    ("args: [--seed, 010]\n", "    --seed 010\n"),
    ("args: [--x, 0x50]\n", "    --x 0x50\n"),
    ("args: [--flag, yes]\n", "    --flag yes\n"),
    ("args: [--flag, on]\n", "    --flag on\n"),
    ("args: [--at, 30:00]\n", "    --at 30:00\n"),
    ("env: {A: 010}\n", "export A=010\n"),
    ("env: {A: 1.10}\n", "export A=1.10\n"),
    ("env: {A: yes}\n", "export A=yes\n"),
    ("env: {A: 1e3}\n", "export A=1e3\n"),
    ("name: 0x50\n", "#SBATCH --job-name=0x50\n"),
    ("name: yes\n", "#SBATCH --job-name=yes\n"),
]


def test_the_corpus_of_both_rounds_is_large_enough() -> None:
    round_two = len(SBATCH_REFUSED) + len(RESERVED_ENV) + len(YAML_REFUSED) + len(YAML_AS_TEXT)
    round_two += len(SBATCH_LITERAL_NAMES) + len(SBATCH_LITERAL_COMMENTS) + len(BAD_RECORDS)
    round_one_size = len(round_one.REFUSED) + len(round_one.REFUSED_FILES) + len(round_one.LITERAL)
    assert round_two >= 150 and round_one_size >= 90


@pytest.mark.parametrize(("flags", "field"), SBATCH_REFUSED)
def test_sbatch_options_and_values_it_would_misread_are_refused(
    flags: list[str], field: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    _assert_refused(run_cli("submit", *flags, cwd=tmp_path, env=env), field, tmp_path, called)


@pytest.mark.parametrize("key", RESERVED_ENV)
def test_environment_keys_the_scripts_read_are_refused(
    key: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    done = run_cli("submit", "--env", f"{key}=x[$(touch PWNED)]", cwd=tmp_path, env=env)
    _assert_refused(done, "env key", tmp_path, called)
    assert repr(key) in done.stderr


def _submit_file(
    content: str, tmp_path: Path, env: dict[str, str], *flags: str
) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.yaml"
    job.write_text(content)
    return run_cli("submit", str(job), *flags, cwd=tmp_path, env=env)


@pytest.mark.parametrize(("content", "field"), YAML_REFUSED)
def test_yaml_scalars_that_are_not_what_they_look_like_are_refused(
    content: str, field: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    _assert_refused(_submit_file(content, tmp_path, env), field, tmp_path, called)


@pytest.mark.parametrize(("content", "shown"), YAML_AS_TEXT)
def test_unquoted_yaml_values_are_read_as_written(
    content: str, shown: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    done = _submit_file(content, tmp_path, fake_slurm[0], "--module", "pkg.train", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert shown in done.stdout, done.stdout


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_special_files_are_refused_without_blocking(
    kind: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    path = {"fifo": tmp_path / "job.yaml", "device": Path("/dev/zero"), "directory": tmp_path}
    if kind == "fifo":
        os.mkfifo(path[kind])  # nobody writes: a plain open() would block forever
    done = run_cli("submit", str(path[kind]), cwd=tmp_path, env=env, timeout=30)
    _assert_refused(done, "JOB_FILE" if kind == "directory" else "job file", tmp_path, called)
    assert "regular file" in done.stderr or "is a directory" in done.stderr


# ---------------------------------------------------------------------------------------------
# 4. Run folders are input too.

GOOD = {
    "job_id": "7",
    "name": "mnist",
    "submitted_at": "2026-12-03T10:00:00+00:00",
    "nodes": 2,
    "world_size": 4,
    "launcher": "torchrun",
}
BAD_RECORDS: list[tuple[str, bytes]] = [
    ("not json", b"{nope"),
    ("a list", b"[1, 2]"),
    ("not utf-8", b"\xff\xfe"),
    ("job id with a command", json.dumps({**GOOD, "job_id": "7; touch PWNED"}).encode()),
    ("job id as a number", json.dumps({**GOOD, "job_id": 7}).encode()),
    ("job id as an option", json.dumps({**GOOD, "job_id": "--help"}).encode()),
    ("nodes as text", json.dumps({**GOOD, "nodes": "2"}).encode()),
    ("nodes as a bool", json.dumps({**GOOD, "nodes": True}).encode()),
    ("negative world", json.dumps({**GOOD, "world_size": -4}).encode()),
    ("unknown launcher", json.dumps({**GOOD, "launcher": "bash"}).encode()),
    ("a missing key", json.dumps({k: v for k, v in GOOD.items() if k != "name"}).encode()),
    ("an extra key", json.dumps({**GOOD, "script": "x"}).encode()),
    ("a long name", json.dumps({**GOOD, "name": "x" * 1000}).encode()),
    ("over the size cap", json.dumps({**GOOD, "name": "x" * 100_000}).encode()),
    ("nested too deeply", b"[" * 30_000 + b"]" * 30_000),  # under the 64 KiB cap
    ("a number of 5,000 digits", b'{"nodes": ' + b"9" * 5000 + b"}"),
    ("a metric that is code", json.dumps({**GOOD, "metric": "x; rm -rf ~"}).encode()),
    ("an unknown backend", json.dumps({**GOOD, "backend": "k8s"}).encode()),
    ("an id of another backend", json.dumps({**GOOD, "backend": "local"}).encode()),
]


def _record(root: Path, name: str, content: bytes | None = None) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    if content is not None:
        (folder / runs.RECORD).write_bytes(content)
    return folder


@pytest.mark.parametrize(("what", "content"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_a_malformed_run_is_skipped_by_list_and_refused_by_the_others(
    what: str, content: bytes, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    root = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    _record(root, "good", json.dumps(GOOD).encode())
    _record(root, "crafted", content)
    listed = run_cli("list", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["7"]
    assert "warning: skipping a run folder" in listed.stderr
    for command in ("status", "logs", "cancel"):
        done = run_cli(command, "crafted", cwd=tmp_path, env=env)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "job.json" in lines[0], (command, lines)
    assert not called.exists() and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_record_that_is_not_a_regular_file_is_never_read(
    kind: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    folder = _record(Path(env["CLUSTERTRAIN_RUNS_DIR"]), "crafted")
    record = folder / runs.RECORD
    if kind == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(GOOD))
        record.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "fifo":
        os.mkfifo(record)
    else:
        record.mkdir()
    done = run_cli("status", "crafted", cwd=tmp_path, env=env, timeout=30)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not called.exists()


def test_text_from_a_run_folder_is_printed_with_control_characters_escaped(
    tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake_slurm
    root = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    folder = _record(root, "colour", json.dumps({**GOOD, "name": "\x1b[2Jevil\rok"}).encode())
    (folder / "logs" / "attempt-0").mkdir()
    (folder / "logs" / "attempt-0" / "node1.out").write_text("[rank0]: hi \x1b]0;title\x07\n")
    listed = run_cli("list", cwd=tmp_path, env=env)
    logs = run_cli("logs", "colour", cwd=tmp_path, env=env)
    assert "\\x1b[2Jevil\\rok" in listed.stdout and "\x1b" not in listed.stdout
    assert "node1 rank0 | hi \\x1b]0;title\\x07" in logs.stdout and "\x1b" not in logs.stdout


# ---------------------------------------------------------------------------------------------
# 5. Slurm unreachable, and sbatch itself reading the rendered lines (the real local cluster).


@pytest.fixture
def controller_down(tmp_path: Path) -> dict[str, str]:
    """The local cluster's config with the controller's port moved to one nobody serves."""
    conf = Path(api.slurm().environ["SLURM_CONF"])
    text = re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=1", conf.read_text())
    down = tmp_path / "slurm.conf"
    down.write_text(text)
    root = tmp_path / "runs"
    job = render(job_spec(nodes=2), str(runs.new_run_dir(root, "mnist")), "/w")
    runs.write_run_files(job)
    runs.record_submission(job, "1", "slurm")
    return {"SLURM_CONF": str(down), "CLUSTERTRAIN_RUNS_DIR": str(root)}


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_status_answers_from_the_run_folder_and_says_slurm_cannot_be_reached(
    cluster: None,  # noqa: F811
    controller_down: dict[str, str],
) -> None:
    done = run_cli("status", "1", env=controller_down)
    assert done.returncode == 0, done.stderr
    assert "job 1 (" in done.stdout and "): UNKNOWN" in done.stdout  # queued, as of its folder
    said = "Slurm not reachable: from the run folder (cannot ask Slurm about job 1: "
    assert said in done.stdout and "controller" in done.stdout


@pytest.mark.slurm
def test_logs_follow_goes_on_while_slurm_cannot_be_reached_and_ends_with_the_run_folder(
    cluster: None,  # noqa: F811
    controller_down: dict[str, str],
) -> None:
    run = runs.find_run(Path(controller_down["CLUSTERTRAIN_RUNS_DIR"]), "1")
    follower = subprocess.Popen(
        [sys.executable, "-P", "-m", "clustertrain", "logs", "1", "--follow"],
        env={**os.environ, **controller_down}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(20)  # scontrol gives up after ~8 s: two failed asks at least
        assert follower.poll() is None, follower.communicate()
        events.append(run.events_path, events.ENDED, status="0")
        _, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert err.count("following the run folder until the controller answers") == 1, err


def _held_job(tmp_path: Path, *flags: str) -> dict[str, str]:
    """Submit the dry run's batch script to the real sbatch, held; return scontrol's fields."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    done = run_cli("submit", "--dry-run", "--nodes", "2", *flags, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    # The section under "#### .../job.sbatch (handed to sbatch)", up to the next file's.
    script = done.stdout.split(" (handed to sbatch)\n", 1)[1].split("#### ", 1)[0]
    batch = tmp_path / "job.sbatch"
    batch.write_text(script)
    submitted = subprocess.run(
        ["sbatch", "--hold", "--parsable", str(batch)],
        capture_output=True, text=True, env=api.slurm().environ, check=True, timeout=30,
        cwd=tmp_path,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", job_id],
            capture_output=True, text=True, env=api.slurm().environ, check=True, timeout=30,
        ).stdout  # fmt: skip
    finally:
        subprocess.run(["scancel", job_id], env=api.slurm().environ, timeout=30, check=False)
    fields = {}
    for key in ("JobName", "Comment", "StdOut", "StdErr", "WorkDir", "NumNodes"):
        # scontrol prints each field as Key=value up to the next field on the line.
        match = re.search(rf"(?:^|\s){key}=(.*?)(?=\s+[A-Z][A-Za-z/:]*=|\s*$)", shown, re.M)
        fields[key] = match[1] if match else ""
    return fields


@pytest.mark.slurm
@pytest.mark.every_slurm
@pytest.mark.parametrize("name", SBATCH_LITERAL_NAMES)
def test_sbatch_reads_the_job_name_exactly(
    cluster: None,  # noqa: F811
    name: str,
    tmp_path: Path,
) -> None:
    fields = _held_job(tmp_path, "--name", name)
    assert fields["JobName"] == name
    assert fields["NumNodes"].split("-")[0] == "2"
    assert fields["StdOut"].startswith(str(tmp_path / "runs")) and fields["WorkDir"] == str(
        tmp_path
    )


@pytest.mark.slurm
@pytest.mark.every_slurm
@pytest.mark.parametrize("comment", SBATCH_LITERAL_COMMENTS)
def test_sbatch_reads_a_passed_through_value_exactly(
    cluster: None,  # noqa: F811
    comment: str,
    tmp_path: Path,
) -> None:
    fields = _held_job(tmp_path, "--sbatch-option", f"--comment={comment}")
    assert fields["Comment"] == comment
    assert fields["NumNodes"].split("-")[0] == "2"
    assert fields["StdErr"].startswith(str(tmp_path / "runs"))


def test_protocol_names_reach_the_rendered_script() -> None:
    job = render(job_spec(), "/r", "/w")
    for name in (protocol.ENV_REQUEUE_FILE, protocol.ENV_RDZV_TIMEOUT_S, protocol.ENV_OUT_DIR):
        assert f"export {name}=" in job.batch_script


def test_every_line_of_status_is_printed_with_control_characters_escaped(
    tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    """Issue 49: the restart lines, lost nodes, reasons and the run folder's name that status
    says come from events anyone who can write the folder may have crafted."""
    env, _ = fake_slurm
    root = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    folder = _record(root, "colour\x1b[2J", json.dumps({**GOOD, "name": "ok"}).encode())
    title = "\x1b]0;pwned\x07"
    for name, values in [
        (events.STARTED, {}),
        (events.NODE_LOST, {"nodes": f"node1{title}"}),
        (events.RESTARTED, {"why": f"a fault{title}"}),
        (events.ENDED, {"status": 1}),
    ]:
        events.append(folder / protocol.EVENTS_FILE, name, **values)
    done = run_cli("status", "7", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout
    assert "colour\\x1b[2J" in done.stdout

"""`clustertrain attach|stacks|top` as users run them, on real processes standing in for a
job's ranks: Slurm's scontrol and srun are fakes on PATH (scontrol says the job runs on node1;
srun runs its command here, as node1), so everything after srun is the real node side."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.render import render
from tests.conftest import ROOT, job_spec, run_cli
from tests.node.test_stacks import start_ranks


def _cli_env(tmp_path: Path, state: str = "RUNNING", uid: int | None = None) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = (f"JobId=42 UserId=me({os.getuid() if uid is None else uid}) JobState={state} "
              f"NodeList=node1 WorkDir={tmp_path}")  # fmt: skip
    scripts = {
        "scontrol": 'if [ "$2" = hostnames ]; then echo node1; '
        f"else echo {shlex.quote(record)}; fi",
        # srun's options, logged, then its command run here as node1's task
        "srun": f'echo "$@" >> {tmp_path}/srun.log\n'
        'while [ "$1" != -- ]; do shift; done; shift\nSLURMD_NODENAME=node1 exec "$@"',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
            "PYTHONPATH": str(ROOT)}  # fmt: skip


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[runs.Run, list[subprocess.Popen[bytes]]]]:
    """Job 42's run folder, and four ranks of its step on node1: ranks 0 and 3 train on, rank 1
    sleeps, rank 2 waits."""
    spec = job_spec(name="train", env={"MY_VAR": "from the spec"})
    found = render(spec, str(runs.new_run_dir(tmp_path / "runs", "train")), str(tmp_path))
    runs.write_run_files(found)
    run = runs.record_submission(found, "42", "slurm")
    modes = ["beat", "hang", "hang", "beat"]
    ranks = start_ranks(run.path / "logs" / "attempt-0", modes, extra={"MY_VAR": "the job's"})
    yield run, ranks
    for proc in ranks:
        proc.kill()
        proc.wait()


def test_stacks_groups_every_rank_and_leaves_them_running(
    job: tuple[runs.Run, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    env = _cli_env(tmp_path)
    done = run_cli("stacks", "42", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("job 42: 4 rank(s) in ")
    assert lines[0].endswith("(by faulthandler for ranks 0-3)")
    heads = [line for line in lines[1:] if line and not line.startswith(" ")]
    assert heads[0] == "rank 1 (1): sleep_forever (rank.py:9)", done.stdout
    assert "rank 2 (1): wait (rank.py:6)" in heads
    assert any(line.startswith("  > sleep_forever  ") for line in lines)  # the user's frame
    assert all(proc.poll() is None for proc in job[1])
    as_json = json.loads(run_cli("stacks", "42", "--json", env=env).stdout)
    assert sorted(r for g in as_json["groups"] for r in g["ranks"]) == [0, 1, 2, 3]
    assert "--ntasks-per-node=1 --nodes=1 --ntasks=1 -- " in (tmp_path / "srun.log").read_text()


def test_top_once_shows_the_node_and_every_rank_with_figures_that_move(
    job: tuple[runs.Run, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    env = _cli_env(tmp_path)
    first = json.loads(run_cli("top", "42", "--once", "--json", env=env).stdout)
    again = run_cli("top", "42", "--once", env=env)
    assert again.returncode == 0, again.stderr
    assert [n["node"] for n in first["nodes"]] == ["node1"] and first["nodes"][0][
        "mem_total_kb"
    ] > 0
    ranks = {r["rank"]: r for r in first["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[0]["step_s"] > 0 and ranks[0]["samples_per_s"] > 0 and ranks[0]["cpu_pct"] > 10
    assert ranks[1]["step_s"] is None  # it stopped beating
    rows = {line.split()[0]: line.split() for line in again.stdout.splitlines()[4:]}
    assert int(rows["0"][2]) > ranks[0]["step"]  # the steps moved between the two calls
    assert again.stdout.splitlines()[2].startswith("node1 ")


def test_attach_runs_a_command_as_argv_in_the_jobs_environment_on_its_node(
    job: tuple[runs.Run, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    env = _cli_env(tmp_path)
    done = run_cli("attach", "42", "--", "sh", "-c", 'echo "$MY_VAR|${RANK-none}"', env=env)
    assert (done.returncode, done.stdout) == (0, "the job's|none\n"), done.stderr
    said = (tmp_path / "srun.log").read_text()
    assert (
        "--jobid=42 --overlap --ntasks-per-node=1 --nodelist=node1 --nodes=1 --ntasks=1 --" in said
    )
    assert "--pty" not in said  # no terminal here: none asked of srun
    assert run_cli("attach", "42", "--", "false", env=env).returncode == 1  # its exit status


@pytest.mark.parametrize(
    ("args", "state", "uid", "said"),
    [
        (("attach", "x y"), "RUNNING", None, "JOB: 'x y' is neither a job id"),
        (("attach", "42", "--node", "-x"), "RUNNING", None, "--node: '-x' is not a node name"),
        (("attach", "42", "--node", "node[1-"), "RUNNING", None, "is not a node name"),
        (("attach", "42", "--node", "node2"), "RUNNING", None, "node2 is not one of job 42's"),
        (("stacks", "42"), "PENDING", None, "JOB: 42 is PENDING: nothing runs inside it yet"),
        (("top", "42", "--once"), "COMPLETED", None, "JOB: 42 is COMPLETED: nothing runs inside"),
        (("stacks", "42"), "RUNNING", 4242, "JOB: 42 is another user's (uid 4242), not yours"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_and_nothing_runs(
    tmp_path: Path, args: tuple[str, ...], state: str, uid: int | None, said: str
) -> None:
    spec = job_spec(name="train")
    runs.write_run_files(found := render(spec, str(runs.new_run_dir(tmp_path / "runs", "t")), "/w"))
    runs.record_submission(found, "42", "slurm")
    done = run_cli(*args, env=_cli_env(tmp_path, state, uid))
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "srun.log").exists()


def test_top_refreshes_until_ctrl_c_which_ends_it_quietly(
    job: tuple[runs.Run, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    argv = [sys.executable, "-P", "-m", "clustertrain", "top", "42"]
    env = {**os.environ, **_cli_env(tmp_path)}
    # SIGINT at its default, as from a terminal: a suite started in the background (`cmd &`)
    # ignores it, and Python keeps an ignored SIGINT ignored, so top would never hear Ctrl-C.
    watching = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    log, deadline = tmp_path / "srun.log", time.monotonic() + 60
    while not log.exists() or log.read_text().count("\n") < 3:  # a third reading has begun
        assert time.monotonic() < deadline and watching.poll() is None
        time.sleep(0.2)
    watching.send_signal(signal.SIGINT)
    out, err = watching.communicate(timeout=30)
    assert watching.returncode == 0 and not err, err
    # a frame a reading (the screen's clearing is for a terminal: click leaves it out of a pipe)
    assert out.decode().count("job 42: 1 node(s), 4 rank(s)\n") >= 2, out

"""`clustertrain run`: the same spec on this machine without Slurm, as users call it (the CLI
as a subprocess), into a run folder that `status`, `logs`, `list` and `cancel` read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

USER_DDP = "tests/jobs/user_ddp.py"
FAIL_RANK = "tests/jobs/fail_rank.py"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _local_id(stdout: str) -> str:
    found = re.search(r"^local run (local-\d+):", stdout, re.MULTILINE)
    assert found, stdout
    return found.group(1)


def test_a_user_script_runs_here_as_its_whole_world(env: dict[str, str]) -> None:
    """2 "nodes" x 2 processes become 4 ranks here; the run folder reads like a Slurm job's."""
    done = run_cli(
        "run", "--script", USER_DDP, "--nodes", "2", "--procs-per-node", "2", env=env, timeout=180
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    seen = re.findall(r"rank(\d) \| user script: rank (\d) of (\d), all-reduce (\d)", done.stdout)
    assert sorted(seen) == [(str(r), str(r), "4", "4") for r in range(4)], done.stdout
    assert done.stderr.endswith(" ended COMPLETED\n"), done.stderr
    job_id = _local_id(done.stdout)

    status = run_cli("status", job_id, env=env)
    assert status.returncode == 0 and f"job {job_id} (user_ddp): COMPLETED" in status.stdout
    listed = run_cli("list", env=env)
    assert listed.stdout.split()[0] == job_id and "2x2 torchrun" in listed.stdout
    logs = run_cli("logs", job_id, "--rank", "3", env=env)
    assert re.findall(r"rank3 \| user script: rank 3 of 4", logs.stdout), logs.stdout


def test_a_user_scripts_headline_metric_is_what_status_and_plot_show(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A script of the user's logs ``val_loss`` through the runtime library; the job names it as
    its headline, lower is better. Nothing of MNIST is involved."""
    done = run_cli(
        "run", "--script", "tests/jobs/val_loss.py", "--metric", "val_loss",
        "--metric-mode", "min", "--", "--lr", "0.25", "--steps", "3", env=env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    job_id = _local_id(done.stdout)
    status = run_cli("status", job_id, env=env)
    # (w - 3)^2 after 3 steps at lr 0.25 (each halves w - 3): (3/8)^2 = 0.140625, + 0.01.
    assert "  final val_loss 0.150625\n" in status.stdout, status.stdout
    assert "test accuracy" not in status.stdout and "test_acc" not in status.stdout
    picture = tmp_path / "val.png"
    drawn = run_cli("plot", job_id, "-o", str(picture), env=env)
    assert drawn.returncode == 0, drawn.stderr
    assert picture.read_bytes().startswith(b"\x89PNG")


def test_a_module_this_hosts_python_cannot_find_is_refused_before_anything_starts(
    env: dict[str, str], tmp_path: Path
) -> None:
    for given, named in (("nosuch.mod", "No module named 'nosuch'"), ("jobs.nosuch", "'jobs")):
        done = run_cli("run", "--module", given, cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"clustertrain: error: module: {given} cannot be imported")
        assert named in done.stderr and done.stderr.count("\n") == 1, done.stderr
    missing = run_cli("run", "--script", "nope.py", cwd=tmp_path, env=env)
    assert missing.returncode == 2
    assert missing.stderr.startswith("clustertrain: error: script: nope.py is not a file in ")
    assert not (tmp_path / "runs").exists()


def test_a_failing_rank_fails_the_run_and_status_says_so(env: dict[str, str]) -> None:
    done = run_cli(
        "run", "--script", FAIL_RANK, "--procs-per-node", "2", "--env", "FAIL_RANK=1",
        env=env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr
    # The run's end, then why, as status says it.
    ended, headline, hint = done.stderr.splitlines()[-3:]
    assert ended.endswith(" ended FAILED"), done.stderr
    assert re.fullmatch(
        r"clustertrain: rank 1 on \S+ raised ValueError: rank 1 gave up at step 20 "
        r"\(fail_rank.py:16\)",
        headline,
    ), done.stderr
    assert hint.startswith("clustertrain: hint: the error is in the job's code at fail_rank.py:16")
    status = run_cli("status", _local_id(done.stdout), env=env)
    assert ": FAILED" in status.stdout, status.stdout
    assert "rank 1 gave up at step 20" in status.stdout, status.stdout


def test_cancel_stops_a_local_run(env: dict[str, str], tmp_path: Path) -> None:
    argv = ["run", "--script", FAIL_RANK, "--procs-per-node", "2"]
    runner = subprocess.Popen(
        [sys.executable, "-m", "clustertrain", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert runner.stdout is not None
        job_id = _local_id(runner.stdout.readline())
        run_dir = next((tmp_path / "runs").iterdir())
        deadline = time.monotonic() + 120
        while "rank 1 ready" not in "".join(p.read_text() for p in run_dir.rglob("*.out")):
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        cancelled = run_cli("cancel", job_id, env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        _, err = runner.communicate(timeout=120)
    finally:
        runner.kill()
    assert runner.returncode == 1 and err.splitlines()[-3].endswith(" ended CANCELLED"), err
    assert err.splitlines()[-2] == (
        "clustertrain: cancelled (clustertrain cancel, or an interrupt of the run)"
    ), err
    record = json.loads((run_dir / "local.json").read_text())
    assert record["cancelled"] is True and record["exit_code"] != 0
    assert ": CANCELLED" in run_cli("status", job_id, env=env).stdout


def test_dry_run_prints_the_standalone_launcher_and_writes_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = run_cli(
        "run", "jobs/mnist.yaml", "--nodes", "2", "--dry-run", "--", "--epochs", "1", env=env
    )
    assert done.returncode == 0, done.stderr
    prepare, command_text = done.stdout.split("\ntorchrun ", 1)
    assert prepare.splitlines()[1:] == ["python -m jobs.mnist.data"], done.stdout
    command = ("torchrun " + command_text).replace("\\\n", "").split()
    assert command[:4] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4"]
    tail = "-m jobs.mnist.train --strategy ddp --recipe fast --epochs 2 --epochs 1"
    assert " ".join(command).endswith(tail), done.stdout
    assert not (tmp_path / "runs").exists()


def test_bad_input_is_one_line_and_nothing_is_written(env: dict[str, str], tmp_path: Path) -> None:
    done = run_cli("run", "--nodes", "0", env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "nodes" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_cancel_signals_no_process_that_a_forged_run_folder_names(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A run folder is anyone's to write: a local.json naming another process, with its true
    start time (readable by anyone in /proc), neither makes it RUNNING nor gets it signalled."""
    from clustertrain import runs
    from clustertrain.procs import start_time
    from clustertrain.render import render
    from tests.conftest import job_spec

    root = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    job = render(job_spec(nodes=1), str(runs.new_run_dir(root, "victim")), str(tmp_path))
    runs.write_run_files(job)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        run = runs.record_submission(job, f"local-{victim.pid}", "local")
        forged = {"pid": victim.pid, "start_time": start_time(victim.pid)}
        (run.path / "local.json").write_text(json.dumps(forged))
        assert ": RUNNING" not in run_cli("status", run.job_id, env=env).stdout
        run_cli("cancel", run.job_id, env=env)
        time.sleep(0.5)
        assert victim.poll() is None, "the forged pid was signalled"
    finally:
        victim.kill()
        victim.wait()

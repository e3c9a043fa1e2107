"""The prepare step and offline jobs, as users call them: the CLI as a subprocess.

A job's prepare commands run on the submit host before anything is queued; a failure or an
interrupt queues nothing and writes nothing. Local runs (`clustertrain run`) are real runs of
the same path, so the success cases are checked there; submissions to the real cluster are
checked by the MNIST end-to-end tests (their job files prepare MNIST).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

REPORT = "tests/jobs/report_env.py"


def _no_run_folder(env: dict[str, str]) -> bool:
    runs = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    return not runs.exists() or not any(runs.iterdir())


def test_the_dry_run_shows_the_prepare_commands_and_runs_none(
    fake_slurm: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, called = fake_slurm
    marker = tmp_path / "ran"
    done = run_cli(
        "submit", "jobs/mnist.yaml", "--prepare", f"touch {marker}", "--prepare", "true",
        "--dry-run", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    head = done.stdout.splitlines()[:3]
    assert head == [
        f"#### prepare: run in {ROOT} before anything is queued (--no-prepare skips it)",
        f"touch {marker}",
        "true",
    ]
    assert not marker.exists() and not called.exists() and _no_run_folder(env)


def test_the_job_files_prepare_mnist_and_no_prepare_drops_it(
    fake_slurm: tuple[dict[str, str], Path],
) -> None:
    env, _ = fake_slurm
    for job_file in ("jobs/mnist.yaml", "jobs/mnist-accelerate.yaml"):
        shown = run_cli("submit", job_file, "--dry-run", env=env).stdout
        assert "#### prepare: " in shown and "\npython -m jobs.mnist.data\n" in shown
        assert 'export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"' in shown
        skipped = run_cli("submit", job_file, "--no-prepare", "--dry-run", env=env).stdout
        assert "#### prepare" not in skipped and "jobs.mnist.data" not in skipped
        both = run_cli("submit", job_file, "--no-prepare", "--prepare", "true", "--dry-run")
        assert both.returncode == 2 and "prepare:" in both.stderr


def test_a_failing_prepare_queues_nothing_and_says_why_in_one_line(
    fake_slurm: tuple[dict[str, str], Path],
) -> None:
    env, called = fake_slurm
    script = "import sys; print('fetching'); print('no route to the data store'); sys.exit(3)"
    done = run_cli(
        "submit", "--script", "train.py", "--no-preflight", "--prepare",
        f"{sys.executable} -c \"{script}\"", env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith("clustertrain: error: prepare: `") and sys.executable in error
    assert "exited with status 3: no route to the data store; nothing was queued" in error
    assert "prepare | fetching" in done.stderr  # shown live, before the verdict
    assert not called.exists() and _no_run_folder(env)


def test_a_missing_program_is_named(fake_slurm: tuple[dict[str, str], Path]) -> None:
    env, called = fake_slurm
    done = run_cli(
        "submit", "--script", "train.py", "--no-preflight", "--prepare", "no-such-program-x",
        env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert "prepare: `no-such-program-x` could not start" in done.stderr.splitlines()[-1]
    assert not called.exists() and _no_run_folder(env)


def test_an_interrupted_prepare_queues_nothing(fake_slurm: tuple[dict[str, str], Path]) -> None:
    env, called = fake_slurm
    # SIGINT as at a terminal: a suite started with `&` by a non-interactive shell (as a CI
    # runner may start it) has SIGINT ignored, and a child would inherit that and ignore it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "clustertrain", "submit", "--script", "train.py",
         "--no-preflight", "--prepare", "sleep 60"],
        cwd=ROOT, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    assert proc.stderr.readline() == "prepare | $ sleep 60\n"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # as Ctrl-C would, to this process alone
    rest = proc.stderr.read()
    assert proc.wait(30) == 2, rest
    assert "prepare: `sleep 60` was interrupted" in rest and "nothing was queued" in rest
    assert not called.exists() and _no_run_folder(env)


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("prepare: python -m jobs.mnist.data", "must be a command as a list of words"),
        ("prepare: [[]]", "prepare[0]: invalid value []"),
        ("prepare: [-rf, x]", "must start with the program to run"),
        ("prepare: [[python, x], oops]", "prepare[1]: invalid value 'oops'"),
        ("offline: yes-please", "offline: invalid value 'yes-please'; must be true or false"),
    ],
)
def test_a_bad_prepare_or_offline_value_is_refused(
    value: str, fix: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"script: train.py\n{value}\n")
    done = run_cli("submit", str(job_file), "--dry-run", env=env)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert fix in done.stderr
    unsplittable = run_cli("submit", "--prepare", "python 'unclosed", "--dry-run", env=env)
    assert unsplittable.returncode == 2 and "cannot be split into words" in unsplittable.stderr
    assert not called.exists() and _no_run_folder(env)


def test_prepare_runs_here_before_the_job_with_its_env_and_venv_never_in_a_shell(
    tmp_path: Path,
) -> None:
    """A local run: the command runs in the submit directory with the job's env and venv, its
    words are never read by a shell, its output is kept, and the job starts after it."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    record = tmp_path / "prepared.json"
    probe = (
        "import json, os, sys; json.dump({'cwd': os.getcwd(), 'exe': sys.executable, "
        "'flag': os.environ.get('PREPARED_BY_TEST'), 'argv': sys.argv[1:]}, "
        f"open({str(record)!r}, 'w')); print('fetched it')"
    )
    done = run_cli(
        "run", "--script", REPORT, "--env", "PREPARED_BY_TEST=yes", "--offline",
        "--prepare", f"python -c \"{probe}\" '$(touch PWNED)' ';' 'rm -rf /'",
        env={**env, "REPORT_AFTER": str(record)}, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    seen = json.loads(record.read_text())
    assert seen["cwd"] == str(ROOT) and seen["flag"] == "yes"
    assert Path(seen["exe"]).parent == Path(sys.prefix) / "bin"  # the job's venv's python
    assert seen["argv"] == ["$(touch PWNED)", ";", "rm -rf /"] and not (ROOT / "PWNED").exists()
    run_dir = Path(re.search(r"run folder: (.+)", done.stdout)[1])  # type: ignore[index]
    assert (run_dir / "prepare.log").read_text() == "fetched it\n"
    # The rank saw the prepare step's file (it ran first) and the offline switches.
    assert "report: prepared before me" in done.stdout
    assert "report: HF_HUB_OFFLINE=1 WANDB_MODE=offline" in done.stdout


def test_a_value_the_user_set_beats_offline(tmp_path: Path) -> None:
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "WANDB_MODE": "online"}
    done = run_cli(
        "run", "--script", REPORT, "--offline", "--env", "HF_HUB_OFFLINE=0", env=env, timeout=180
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "report: HF_HUB_OFFLINE=0 WANDB_MODE=online" in done.stdout

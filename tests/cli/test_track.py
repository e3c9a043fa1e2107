"""``clustertrain track`` as users run it: a relay, a relay again, bad input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.render import render
from tests.cli.test_slurm_unreachable import fake_slurm_down
from tests.conftest import job_spec, run_cli
from tests.track.conftest import write


@pytest.fixture
def env_run(tmp_path: Path) -> tuple[dict[str, str], runs.Run]:
    """A run folder under the runs root of an environment whose Slurm is down: the job's
    state is what its run folder says."""
    env = fake_slurm_down(tmp_path)
    job = render(job_spec(name="mnist"), str(runs.new_run_dir(tmp_path / "runs", "mnist")), "/w")
    runs.write_run_files(job)
    return env, runs.record_submission(job, "42", "slurm")


def test_track_to_tensorboard_then_again_sends_nothing(
    env_run: tuple[dict[str, str], runs.Run],
) -> None:
    pytest.importorskip("tensorboard")
    env, run = env_run
    write(run, "started", nodes="node1")
    for step in range(5):
        write(run, "metrics", step=step, loss=1.0, test_acc=0.9)
    write(run, "ended", status="0")
    done = run_cli("track", "42", "--to", "tensorboard", env=env)
    assert done.returncode == 0, done.stderr
    assert "tensorboard: 10 point(s) sent; ended COMPLETED" in done.stdout
    assert list((run.path / "tensorboard" / "relay").glob("events.out.tfevents.*"))
    again = run_cli("track", "last", "--to", "tensorboard", env=env)
    assert again.returncode == 0 and "tensorboard: 0 point(s) sent" in again.stdout


@pytest.mark.parametrize("uri", ["not a uri", "http//x", "://x", "http://host:99999", "x\x1b[2J"])
def test_a_uri_that_is_no_uri_is_one_line_naming_the_option(
    env_run: tuple[dict[str, str], runs.Run], uri: str
) -> None:
    env, _ = env_run
    done = run_cli("track", "42", "--to", "mlflow", "--uri", uri, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--uri" in done.stderr
    assert "\x1b" not in done.stderr


def test_an_unknown_tracker_and_the_help(env_run: tuple[dict[str, str], runs.Run]) -> None:
    env, _ = env_run
    assert run_cli("track", "42", "--to", "comet", env=env).returncode == 2
    helped = run_cli("track", "--help", env=env)
    assert "clustertrain track 42 --to mlflow --uri http://127.0.0.1:5000 --follow" in (
        helped.stdout
    )


def test_track_to_wandb_says_what_it_synced(
    env_run: tuple[dict[str, str], runs.Run], tmp_path: Path
) -> None:
    env, run = env_run
    offline = run.path / "wandb" / "offline-run-20261207_120000-abc123"
    offline.mkdir(parents=True)
    stub = Path(env["PATH"].split(":")[0]) / "wandb"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "synced"}\n')
    stub.chmod(0o755)
    write(run, "metrics", step=1, loss=0.5)
    early = run_cli("track", "42", "--to", "wandb", env=env)
    assert early.returncode == 0 and "has not ended yet" in early.stdout
    write(run, "ended", status="0")
    done = run_cli("track", "42", "--to", "wandb", env=env)
    assert done.returncode == 0, done.stderr
    assert f"wandb: synced {offline}" in done.stdout
    assert (tmp_path / "synced").read_text() == f"sync {offline}\n"


def test_logs_follow_relays_to_the_job_files_trackers(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    env = fake_slurm_down(tmp_path)
    spec = job_spec(name="mnist", track=["tensorboard"])
    job = render(spec, str(runs.new_run_dir(tmp_path / "runs", "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "42", "slurm")
    write(run, "started", nodes="node1")
    for step in range(3):
        write(run, "metrics", step=step, loss=1.0 / (step + 1))
    write(run, "ended", status="0")
    done = run_cli("logs", "42", "--follow", env=env)
    assert done.returncode == 0, done.stderr
    kept = run.path / "track" / "tensorboard.json"
    assert kept.exists() and '"done": true' in kept.read_text()
    again = run_cli("track", "42", "--to", "tensorboard", env=env)
    assert "tensorboard: 0 point(s) sent" in again.stdout

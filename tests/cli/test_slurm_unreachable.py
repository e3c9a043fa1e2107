"""Every command answers when Slurm cannot be reached: ``status``, ``list`` and ``logs
--follow`` from the run folder, saying so; ``cancel`` in one line that nothing was cancelled.

Slurm's commands are fakes on PATH that print what Slurm's print when its controller is down
(or when no configuration is found) and exit 1, and log each call.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain import api, runs
from clustertrain.render import render
from tests.conftest import ROOT, job_spec, run_cli

CONTROLLER_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
NO_CONFIG = (
    "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "scontrol: error: fetch_config: DNS SRV lookup failed\n"
    "scontrol: error: _establish_config_source: failed to fetch config\n"
    "scontrol: fatal: Could not establish a configuration source"
)


def fake_slurm_down(tmp_path: Path, said: str = CONTROLLER_DOWN) -> dict[str, str]:
    """An environment whose Slurm commands all fail with ``said``; each call is appended to
    ``calls`` beside them. No local cluster (CLUSTERTRAIN_CLUSTER_DIR names none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in ("scontrol", "squeue", "sacct", "scancel", "sinfo", "sbatch", "srun"):
        stub = bin_dir / name
        stub.write_text(
            f'#!/bin/sh\necho {name} "$@" >> {shlex.quote(str(calls))}\n'
            f"printf '%s\\n' {shlex.quote(said)} >&2\nexit 1\n"
        )
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERTRAIN_CLUSTER_DIR": str(tmp_path / "no-cluster"),
    }


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def _event(run: runs.Run, name: str, **values: object) -> None:
    with run.events_path.open("a") as handle:
        line = {"time": time.time(), "event": name, "attempt": 0, **values}
        handle.write(json.dumps(line) + "\n")


def _slurm_run(env: dict[str, str], job_id: str = "1", ended: str | None = "0") -> runs.Run:
    """An MNIST-like Slurm job's run folder: started on node[1-2], test_acc logged, and (unless
    ``ended`` is None) its supervisor's end with that status."""
    root = Path(env["CLUSTERTRAIN_RUNS_DIR"])
    spec = job_spec(name="mnist", nodes=2, metric="test_acc")
    job = render(spec, str(runs.new_run_dir(root, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, job_id, "slurm")
    _event(run, "started", nodes="node[1-2]")
    _event(run, "epoch", epoch=1, step=20, test_acc=0.9924)
    if ended is not None:
        _event(run, "ended", status=ended)
    return run


def test_status_answers_from_the_run_folder_and_says_so(tmp_path: Path) -> None:
    env = fake_slurm_down(tmp_path)
    _slurm_run(env)
    done = run_cli("status", "last", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(": COMPLETED") and "nodes: node[1-2]" in lines[1]
    assert "  final test_acc 0.9924" in lines
    assert (
        f"  Slurm not reachable: from the run folder (cannot ask Slurm about job 1: "
        f"{CONTROLLER_DOWN}; check `scontrol ping` and SLURM_CONF)" in lines
    ), done.stdout
    as_json = json.loads(run_cli("status", "1", "--json", env=env).stdout)
    assert (as_json["state"], as_json["source"]) == ("COMPLETED", "run folder")


def test_status_of_a_job_without_an_end_says_it_is_the_folder_view(tmp_path: Path) -> None:
    env = fake_slurm_down(tmp_path)
    _slurm_run(env, ended=None)
    done = run_cli("status", env=env)
    assert done.returncode == 0, done.stderr
    assert ": UNKNOWN" in done.stdout.splitlines()[0]
    assert "reason: running as of its last event (epoch, " in done.stdout
    assert "Slurm not reachable: from the run folder" in done.stdout


def test_list_shows_state_nodes_elapsed_and_metric_marking_the_folder_ones(
    tmp_path: Path,
) -> None:
    env = fake_slurm_down(tmp_path)
    _slurm_run(env, "1")
    _slurm_run(env, "2", ended="1")
    done = run_cli("list", env=env)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()}
    assert set(rows) == {"1", "2"}
    assert rows["1"][5:10] == ["COMPLETED*", "node[1-2]", "00:00:00", "test_acc", "0.9924"]
    assert rows["2"][5] == "FAILED*"
    assert done.stderr.count("Slurm not reachable") == 1, done.stderr
    assert "the states marked * are the run folders'" in done.stderr
    assert len(_calls(tmp_path)) == 1  # asked once: the second run's state is its folder's


def test_cancel_says_in_one_line_that_nothing_was_cancelled(tmp_path: Path) -> None:
    env = fake_slurm_down(tmp_path)
    _slurm_run(env, ended=None)
    done = run_cli("cancel", "1", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot cancel job 1: Slurm's controller cannot be reached" in line
    assert "nothing was cancelled" in line and done.stdout == ""


def test_logs_follow_keeps_reading_the_run_folder_and_ends_with_its_end_event(
    tmp_path: Path,
) -> None:
    env = fake_slurm_down(tmp_path)
    run = _slurm_run(env, ended=None)
    log = run.logs_dir / "attempt-0" / "node1.out"
    log.parent.mkdir()
    log.write_text("[rank0]: epoch 1\n")
    follower = subprocess.Popen(
        [sys.executable, "-P", "-m", "clustertrain", "logs", "1", "--follow"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(5)  # a few of Slurm's retries (1 s, 2 s), the job still running
        assert follower.poll() is None, follower.communicate()
        with log.open("a") as handle:
            handle.write("[rank0]: done\n")
        _event(run, "ended", status="0")
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out.splitlines() == ["node1 rank0 | epoch 1", "node1 rank0 | done"]
    assert err.count("following the run folder until the controller answers") == 1, err
    assert err.splitlines()[-1] == "clustertrain: job 1 ended COMPLETED"
    assert len(_calls(tmp_path)) >= 3  # asked again meanwhile


def test_without_a_configuration_the_hint_names_the_local_cluster_slurm_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clustertrain.localcluster import lifecycle

    said = f"cannot ask Slurm about job 1: {NO_CONFIG.splitlines()[2]}"
    monkeypatch.setattr(lifecycle, "local_slurm_conf", lambda: None)
    assert api.slurm_conf_hint(said) == said
    conf = tmp_path / "slurm.conf"
    monkeypatch.setattr(lifecycle, "local_slurm_conf", lambda: conf)
    assert api.slurm_conf_hint(said) == f"{said}; the local cluster is up: export SLURM_CONF={conf}"
    assert api.slurm_conf_hint(CONTROLLER_DOWN) == CONTROLLER_DOWN  # a configuration, no answer


def test_without_a_configuration_and_no_local_cluster_status_still_answers(
    tmp_path: Path,
) -> None:
    env = fake_slurm_down(tmp_path, NO_CONFIG)
    _slurm_run(env)
    done = run_cli("status", env=env)
    assert done.returncode == 0 and ": COMPLETED" in done.stdout, done.stderr
    assert "_establish_config_source: failed to fetch config" in done.stdout
    assert "export SLURM_CONF" not in done.stdout

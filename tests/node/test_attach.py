"""The shell of `clustertrain attach` (clustertrain.node.attach): the environment of a rank
found on this node, less a rank's own variables, with this step's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clustertrain import protocol
from clustertrain.node import attach
from tests.conftest import ROOT
from tests.node.test_stacks import start_ranks


def test_the_shell_gets_the_ranks_environment_less_its_own_and_with_this_steps() -> None:
    rank = {"RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x", "MY_VAR": "job's",
            "PATH": "/venv/bin:/bin", "SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": "1",
            "TERM": "dumb"}  # fmt: skip
    ours = {"SLURM_STEP_ID": "7", "TERM": "xterm", "PATH": "/login/bin", "HOME": "/root"}
    assert attach.environment(rank, ours) == {
        "PATH": "/venv/bin:/bin", "MY_VAR": "job's", "SLURM_STEP_ID": "7", "TERM": "xterm"
    }  # fmt: skip
    assert attach.fallback({"PATH": "/bin"}, ["A=1", "B=x=y"], "/venv/bin") == {
        "PATH": "/venv/bin:/bin", "A": "1", "B": "x=y"
    }  # fmt: skip


def test_a_command_runs_as_argv_in_a_ranks_environment_and_folder(tmp_path: Path) -> None:
    ranks = start_ranks(tmp_path, ["hang"], extra={"MY_VAR": "from the job"})
    beats = str(tmp_path / protocol.HEARTBEAT_DIR)
    env = {**os.environ, "SLURMD_NODENAME": "node1", "PYTHONPATH": str(ROOT)}
    try:
        argv = [sys.executable, "-m", "clustertrain.node.attach", beats, "--chdir", "/", "--",
                "sh", "-c", 'echo "$MY_VAR|${RANK-unset}|$PWD"', "ignored"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        # no rank on node2: the job's words stand in, and it says so
        alone = subprocess.run(
            [*argv[:4], "--env", "MY_VAR=from the spec", "--", "sh", "-c", 'echo "$MY_VAR|$PWD"'],
            capture_output=True, text=True, timeout=60, env={**env, "SLURMD_NODENAME": "node2"},
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        ranks[0].kill()
        ranks[0].wait()
    assert done.stdout == f"from the job|unset|{tmp_path}\n", done.stderr
    assert alone.stdout == f"from the spec|{tmp_path}\n", alone.stderr
    assert "no rank of the job runs on node2 yet" in alone.stderr

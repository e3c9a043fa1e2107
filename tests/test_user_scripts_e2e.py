"""Users' own scripts, which do not import clustertrain, on 2 nodes x 2 processes of the real
local cluster: each must see the whole world of 4, whichever launcher starts it. The nodes have
no GPU (the case where `accelerate launch --multi_gpu` used to start four lone trainings)."""

from __future__ import annotations

import re
from pathlib import Path

import accelerate
import pytest

from tests.conftest import run_cli
from tests.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
NODES = ["--nodes", "2", "--gpus-per-node", "0", "--procs-per-node", "2", "--cpus-per-task", "2"]
TEST_OPS = Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_ops.py"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _run(env: dict[str, str], launcher: str, script: str) -> str:
    job_id, _ = submit(env, *NODES, "--launcher", launcher, "--script", script)
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return done.stdout


def test_a_plain_accelerate_script_sees_the_whole_world(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    out = _run(env, "accelerate", "tests/jobs/user_accelerate.py")
    seen = re.findall(r"process (\d) of (\d), weights identical on every process: (\w+)", out)
    assert sorted(seen) == [(str(r), "4", "True") for r in range(4)], out[-3000:]


def test_a_plain_ddp_script_sees_the_whole_world(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    out = _run(env, "torchrun", "tests/jobs/user_ddp.py")
    seen = re.findall(r"rank (\d) of (\d), all-reduce (\d), threads (\d+)", out)
    # Each node's task has 2 CPUs, shared by its 2 processes: 1 thread each (the split with
    # more threads per rank is tested in test_site_e2e).
    assert sorted(seen) == [(str(r), "4", "4", "1") for r in range(4)], out[-3000:]


def test_accelerates_own_test_ops_script(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    out = _run(env, "accelerate", str(TEST_OPS))
    # Its main process prints the state it found, then each check it passed (they assert).
    assert "Num processes: 4" in out and "MULTI_CPU" in out, out[-3000:]
    assert "testing gather" in out and "testing broadcast" in out

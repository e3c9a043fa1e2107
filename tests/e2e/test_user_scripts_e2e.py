"""Users' own scripts, which do not import clustertrain, on 2 nodes x 2 processes of the real
local cluster: each must see the whole world of 4, whichever launcher starts it. The nodes have
no GPU (the case where `accelerate launch --multi_gpu` used to start four lone trainings).
Last, a script that logs its own headline metric with the runtime library, swept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import accelerate
import pytest

from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

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


def test_a_user_scripts_headline_metric_orders_its_sweep(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A script of the user's logs val_loss (lower is better); nothing of MNIST is involved."""
    job_id, _ = submit(
        env, "--nodes", "1", "--gpus-per-node", "0", "--cpus-per-task", "1",
        "--script", "tests/jobs/val_loss.py", "--metric", "val_loss", "--metric-mode", "min",
        "--sweep", "lr=0.1,0.4",
    )  # fmt: skip
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    table = json.loads(run_cli("results", job_id, "--json", env=env).stdout)
    # (w - 3)^2 + 0.01 after 5 steps: lr 0.4 shrinks w - 3 by 5x a step, lr 0.1 by 1.25x.
    assert [(r["params"]["lr"], r["metric"]) for r in table] == [
        ("0.4", "val_loss"),
        ("0.1", "val_loss"),
    ]
    assert table[0]["value"] < 0.011 < 0.9 < table[1]["value"] < 1.0, table
    status = run_cli("status", job_id, env=env).stdout
    assert re.search(r"task 0 \(lr=0\.1\): COMPLETED, val_loss 0\.9", status), status
    picture = tmp_path / "sweep.png"
    drawn = run_cli("plot", job_id, "-o", str(picture), env=env)
    assert drawn.returncode == 0 and picture.read_bytes().startswith(b"\x89PNG"), drawn.stderr

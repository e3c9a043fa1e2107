"""Environment modules, as a site's user meets them: a job whose script needs what a module
sets runs only when its setup lines load it (Debian's Lmod on the nodes, a modulefile this test
owns), ends in one line without it, and a setup line that fails ends the job before any rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, follow, submit  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]
SCRIPT = ["--launcher", "torchrun", "--script", "tests/jobs/needs_module.py", "--nodes", "2",
          "--gpus-per-node", "0", "--cpus-per-task", "1"]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    """A module folder of the test's own, as a site's /apps/modulefiles."""
    found = tmp_path / "modulefiles"
    (found / "clustertrain-test").mkdir(parents=True)
    (found / "clustertrain-test" / "1.0.lua").write_text(
        'setenv("CLUSTERTRAIN_TEST_MODULE", "clustertrain-test/1.0")\n'
    )
    found.chmod(0o755)
    return found


def test_a_job_that_needs_a_module_runs_when_its_setup_loads_it(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    modules: Path,
) -> None:
    job_id, _ = submit(
        env, *SCRIPT, "--setup", f"module use {modules}", "--setup", "module load clustertrain-test"
    )
    done = follow(env, job_id)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.count("sees module clustertrain-test/1.0") == 2, done.stdout[-3000:]


def test_without_the_module_the_job_fails_in_one_line_naming_what_is_missing(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    job_id, _ = submit(env, *SCRIPT)
    assert follow(env, job_id).returncode != 0
    status = run_cli("status", job_id, env=env)
    assert "FAILED" in status.stdout, status.stdout
    assert "CLUSTERTRAIN_TEST_MODULE is not set" in status.stdout, status.stdout


def test_a_setup_line_that_fails_ends_the_job_before_any_rank(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    modules: Path,
) -> None:
    job_id, run_dir = submit(
        env, *SCRIPT, "--setup", f"module use {modules}", "--setup", "module load no-such-module"
    )
    assert follow(env, job_id).returncode != 0
    status = run_cli("status", job_id, env=env)
    assert "FAILED" in status.stdout, status.stdout
    assert "setup line 2 failed" in status.stdout, status.stdout
    assert "module load no-such-module" in status.stdout, status.stdout
    ranks = [p.read_text(errors="replace") for p in (run_dir / "logs").rglob("*") if p.is_file()]
    assert not [text for text in ranks if "needs-module:" in text]  # no rank started

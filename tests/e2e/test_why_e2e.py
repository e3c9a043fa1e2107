"""Why a job failed, on the real cluster: jobs of 2 nodes x 2 ranks that die each its own way
(tests/fixtures/why/die.py, a script that does not import clustertrain), queued together; for
each, ``status`` prints the right one-line cause with its rank and node, ``status --why`` the
evidence in at most 20 lines, ``Job.failure`` the same cause, and the follower's last words say it.

With CLUSTERTRAIN_KEEP_WHY=DIR, each job's records are also copied into DIR as a corpus case
(tests/fixtures/why/<kind>/slurm-<case>/): how the real-Slurm cases were made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from clustertrain import api
from clustertrain.runs import why
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm

NODE = r"node\d"
# case: (DIE, DIE_RANK, kind, rank, the headline's pattern)
CASES = {
    "segfault": ("segfault", 3, why.Kind.SIGNAL, 3,
                 rf"rank 3 on {NODE} was killed by SIGSEGV \(signal 11, a segmentation fault\)"),
    "abort-at-exit": ("at-exit", 0, why.Kind.DIED_AT_EXIT, 0,
                      r"finished, then rank 0 aborted at exit \(SIGABRT: terminate called without "
                      r"an active exception\); all ranks completed training"),
    "disk-full": ("disk-full", 1, why.Kind.DISK_FULL, 1,
                  rf"rank 1 on {NODE} could not write: no space left on device"),
    "missing-data": ("missing-data", 0, why.Kind.MISSING_DATA, 0,
                     rf"rank 0 on {NODE} did not find its data: FileNotFoundError: "),
    "no-dependency": ("no-dependency", 2, why.Kind.NOT_IMPORTABLE, 2,
                      rf"rank 2 on {NODE} could not import: No module named "
                      r"'transformers_not_installed'"),
    "sigbus": ("sigbus", 2, why.Kind.SIGNAL, 2,
               rf"rank 2 on {NODE} was killed by SIGBUS \(signal 7, a bus error\)"),
    "time-limit": ("sleep", 99, why.Kind.TIME_LIMIT, None,
                   r"reached its time limit after 00:01:\d\d \(Slurm: TIMEOUT\)"),
}  # fmt: skip
# What a case asks of Slurm besides: the time-limit case a minute of it.
EXTRA = {"time-limit": ("--time", "00:01:00")}
END_WITHIN_S = 240


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _submit(env: dict[str, str], die: str, rank: int, *extra: str) -> tuple[str, Path]:
    return submit(
        env, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "1", *extra,
        "--script", "tests/fixtures/why/die.py", "--env", f"DIE={die}", "--env", f"DIE_RANK={rank}",
    )  # fmt: skip


def _wait(job: api.Job) -> None:
    deadline = time.monotonic() + END_WITHIN_S
    while not job.job_state().finished:
        assert time.monotonic() < deadline, f"job {job.job_id} never ended"
        time.sleep(2)


def test_each_way_a_job_dies_is_named_in_one_line_with_its_rank_and_node(
    cluster: None,  # noqa: F811
    env: dict[str, str],
) -> None:
    jobs = {
        case: _submit(env, die, rank, *EXTRA.get(case, ()))
        for case, (die, rank, *_) in CASES.items()
    }
    sleeper = _submit(env, "cancelled", 99)  # every rank waits 60 s: it is cancelled first
    attached = api.Job.attach(sleeper[0], env["CLUSTERTRAIN_RUNS_DIR"])
    while attached.job_state().state != "RUNNING":
        time.sleep(1)
    assert run_cli("cancel", sleeper[0], env=env).returncode == 0
    for case, (job_id, run_dir) in jobs.items():
        _, _, kind, rank, headline = CASES[case]
        job = api.Job.attach(job_id, env["CLUSTERTRAIN_RUNS_DIR"])
        _wait(job)
        status = run_cli("status", job_id, env=env).stdout
        assert re.search(rf"^  {headline}", status, re.MULTILINE), (case, status)
        evidence = run_cli("status", job_id, "--why", env=env).stdout.splitlines()
        assert re.match(rf"  {headline}", evidence[1]) and evidence[3] == "  evidence:", evidence
        assert len(evidence) <= 4 + why.MAX_EVIDENCE, (case, evidence)
        failure = job.failure
        assert failure is not None and (failure.kind, failure.rank) == (kind, rank), failure
        assert rank is None or re.fullmatch(NODE, failure.node or ""), failure
        followed = run_cli("logs", job_id, "--follow", env=env, timeout=60)
        assert followed.returncode == 1 and re.search(headline, followed.stderr), followed.stderr
        _keep(case, kind, job, run_dir, failure)
    _wait(attached)
    cancelled = attached.failure
    assert cancelled is not None and cancelled.kind is why.Kind.CANCELLED, cancelled
    assert re.match(r"cancelled by \S+ \(uid \d+\)", cancelled.headline), cancelled
    _keep("scancel", why.Kind.CANCELLED, attached, sleeper[1], cancelled)


def _keep(case: str, kind: why.Kind, job: api.Job, run_dir: Path, found: why.Cause) -> None:
    """The job's records as a corpus case, where CLUSTERTRAIN_KEEP_WHY asks for them."""
    keep = os.environ.get("CLUSTERTRAIN_KEEP_WHY")
    if not keep:
        return
    folder = Path(keep) / kind.value / f"slurm-{case}"
    folder.mkdir(parents=True, exist_ok=True)
    for log in (run_dir / "logs" / "attempt-0").glob("node*.*"):
        shutil.copy(log, folder / log.name)
    shutil.copy(run_dir / "logs" / f"slurm-{job.job_id}.err", folder / "slurm.err")
    state = job.job_state()
    said = {"state": state.state, "exit_code": state.exit_code, "reason": state.reason}
    (folder / "state.json").write_text(json.dumps(said) + "\n")
    sacct = subprocess.run(
        ["sacct", "-P", "-n", "-j", job.job_id, "-o",
         "JobID,State,ExitCode,ElapsedRaw,MaxRSS,TotalCPU"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (folder / "sacct.txt").write_text(sacct.stdout.replace(job.job_id, "42"))
    expected = {"kind": kind.value, "rank": found.rank, "node": found.node}
    expected["headline"] = found.headline.split(" (")[0].replace(job.job_id, "42")
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")

"""Inside a running job on the real local Slurm cluster: a shell on a node (a real terminal),
every rank's stack, the nodes' and ranks' figures, the job left running by each
(clustertrain.backends.inside, through srun --overlap). One 2 x 2 job serves every test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.conftest import ROOT, run_cli
from tests.e2e.test_remote_e2e import _submit as remote_submit
from tests.e2e.test_remote_e2e import tree  # noqa: F401  (a fixture)
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
SCRIPT = "tests/jobs/hold_rank.py"
Job = tuple[dict[str, str], str, Path]  # the CLI's environment, the job's id, its run folder


def _line(text: str) -> int:
    lines = Path(ROOT, SCRIPT).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


@pytest.fixture(scope="module")
def job(
    cluster: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Job]:
    """A 2 x 2 job training (every rank beating), cancelled at the end."""
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path_factory.mktemp("inside") / "runs")}
    job_id, run_dir = submit(
        env, "--script", SCRIPT, "--nodes", "2", "--procs-per-node", "2", "--cpus-per-task", "1",
        "--env", "INSIDE_TEST=from the job",
    )  # fmt: skip
    try:
        beats = run_dir / "logs" / "attempt-0" / "heartbeats"
        deadline = time.monotonic() + 240
        while len(list(beats.glob("rank-?"))) < 4 or not _stepped(beats, 5):
            assert time.monotonic() < deadline, run_cli("status", job_id, env=env).stdout
            time.sleep(1)
        yield env, job_id, run_dir
    finally:
        subprocess.run(["scancel", job_id], check=False)


def _stepped(beats: Path, steps: int) -> bool:
    return all(
        int((path.read_text().split() or ["0"])[0]) >= steps for path in beats.glob("rank-?")
    )


def _nodes(env: dict[str, str], job_id: str, cwd: Path = ROOT) -> list[str]:
    """The job's nodes, first first (Slurm places it where the cluster has room)."""
    seen = json.loads(run_cli("top", job_id, "--once", "--json", cwd=cwd, env=env).stdout)
    return sorted(node["node"] for node in seen["nodes"])


def _running(env: dict[str, str], job_id: str) -> bool:
    return json.loads(run_cli("status", job_id, "--json", env=env).stdout)["state"] == "RUNNING"


def test_top_shows_every_node_and_rank_with_figures_that_move(
    job: Job,
) -> None:
    env, job_id, _ = job
    first = run_cli("top", job_id, "--once", "--json", env=env)
    assert first.returncode == 0, first.stderr
    again = run_cli("top", job_id, "--once", env=env)
    assert again.returncode == 0, again.stderr
    print(again.stdout)
    view = json.loads(first.stdout)
    assert len(view["nodes"]) == 2 and not view["silent"], view
    ranks = {r["rank"]: r for r in view["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(r["step_s"] and 0.15 < r["step_s"] < 2 for r in ranks.values()), ranks
    assert all(r["samples_per_s"] and r["rss_kb"] for r in ranks.values()), ranks
    rows = {line.split()[0]: line.split() for line in again.stdout.splitlines()[4:]}
    assert all(int(rows[str(r)][2]) > ranks[r]["step"] for r in ranks), again.stdout  # moved
    assert _running(env, job_id)


def test_stacks_of_a_training_job_are_few_groups_and_it_trains_on(
    job: Job,
) -> None:
    env, job_id, run_dir = job
    done = run_cli("stacks", job_id, env=env)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    heads = [line for line in done.stdout.splitlines()[1:] if line and not line.startswith(" ")]
    assert 1 <= len(heads) <= 2, done.stdout
    assert "4 rank(s)" in done.stdout and "(by faulthandler for ranks 0-3)" in done.stdout
    assert len(list((run_dir / "stacks").iterdir())) == 1
    beats = run_dir / "logs" / "attempt-0" / "heartbeats"
    before = max(int(p.read_text().split()[0]) for p in beats.glob("rank-?"))
    time.sleep(2)
    assert _stepped(beats, before + 1) and _running(env, job_id)


def test_attach_gives_a_shell_on_the_node_and_exit_leaves_the_job_running(
    job: Job,
) -> None:
    env, job_id, _ = job
    first, second = _nodes(env, job_id)
    shell = pexpect.spawn(
        sys.executable, ["-m", "clustertrain", "attach", job_id, "--node", second],
        env={**os.environ, **env}, cwd=str(ROOT),
        encoding="utf-8", timeout=60,
    )  # fmt: skip
    try:
        shell.sendline('hostname; echo "var=$INSIDE_TEST rank=${RANK-none}"')
        shell.expect(rf"{second}\r?\n")
        shell.expect(r"var=from the job rank=none")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close()
    assert shell.exitstatus == 0
    done = run_cli("attach", job_id, "--", "hostname", env=env)
    assert (done.returncode, done.stdout) == (0, f"{first}\n"), done.stderr
    assert _running(env, job_id)


def test_stacks_name_a_held_rank_alone(job: Job) -> None:
    env, job_id, run_dir = job
    (run_dir / "out" / "hold-rank-1").touch()
    time.sleep(3)
    done = run_cli("stacks", job_id, "--json", env=env)
    assert done.returncode == 0, done.stderr
    groups = json.loads(done.stdout)["groups"]
    assert (
        groups[0]["ranks"] == [1]
        and groups[0]["place"] == f"<module> (hold_rank.py:{_line('# held')})"
    )
    assert [g["ranks"] for g in groups[1:]] == [[0, 2, 3]], groups
    assert groups[1]["place"].startswith("all_reduce (hold_rank.py:"), groups
    print(run_cli("stacks", job_id, env=env).stdout)
    (run_dir / "out" / "hold-rank-1").unlink()


def test_through_a_login_node_with_a_terminal_there(
    tree: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A job submitted with --host: stacks, top and attach are its login node's clustertrain's
    answers (this checkout's, through a wrapper), attach with a terminal there (ssh -t)."""
    wrapper = tmp_path / "clustertrain-here"  # the login node sees this machine's files
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m clustertrain "$@"\n')
    wrapper.chmod(0o755)
    env = {
        "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"),
        "CLUSTERTRAIN_REMOTE_CLUSTERTRAIN": str(wrapper),
    }
    job_id, _, _ = remote_submit(
        tree, env, "--script", SCRIPT, "--nodes", "2", "--procs-per-node", "1",
        "--cpus-per-task", "1",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "rank(s) in" not in (stacks := run_cli("stacks", job_id, cwd=tree, env=env)).stdout:
            assert time.monotonic() < deadline, stacks.stderr
            time.sleep(2)
        assert "2 rank(s) in " in stacks.stdout, stacks.stdout
        first, second = _nodes(env, job_id, cwd=tree)
        done = run_cli("attach", job_id, "--node", second, "--", "hostname", cwd=tree, env=env)
        assert (done.returncode, done.stdout.strip()) == (0, second), done.stderr
        shell = pexpect.spawn(
            sys.executable, ["-P", "-m", "clustertrain", "attach", job_id], cwd=str(tree),
            env={**os.environ, **env}, encoding="utf-8", timeout=90,
        )  # fmt: skip
        shell.sendline("tty; hostname")
        shell.expect(r"/dev/pts/\d+\r?\n")  # a terminal on the node, through ssh -t and srun --pty
        shell.expect(rf"{first}\r?\n")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
        shell.close()
        assert shell.exitstatus == 0
    finally:
        run_cli("cancel", job_id, cwd=tree, env=env)

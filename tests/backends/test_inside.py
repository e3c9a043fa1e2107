"""Inside a running job (clustertrain.backends.inside): the job checked before anything runs on
its nodes, the srun command lines built, and what comes back read as input. The backend and
the runner are fakes; tests/cli/test_inside_cli.py runs the node side for real, and
tests/e2e/test_inside_e2e.py the whole on the local Slurm cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.backends import inside
from clustertrain.backends.slurm import SlurmBackend
from clustertrain.backends.slurm.commands import Slurm
from clustertrain.errors import UserError
from clustertrain.jobstate import Holding
from clustertrain.render import render
from tests.conftest import job_spec
from tests.node.test_frames import SLEEPING, WAITING


class Held(SlurmBackend):
    """Slurm's command lines, a fixed allocation."""

    def __init__(self, holding: Holding) -> None:
        super().__init__()
        self.held = holding

    def holding(self, run: runs.Run) -> Holding:
        return self.held


def _run(tmp_path: Path, **fields: object) -> runs.Run:
    spec = job_spec(name="train", nodes=2, **fields)
    job = render(spec, str(runs.new_run_dir(tmp_path / "runs", "train")), "/w")
    runs.write_run_files(job)
    return runs.record_submission(job, "42", "slurm")


ME = os.getuid()
GONE, OTHERS = "nothing runs inside it any more", f"another user's (uid {ME + 1}), not yours"
RUNNING = Holding("42", "RUNNING", ME, ("node1", "node2"), "/w")


@pytest.mark.parametrize(
    ("held", "node", "said"),
    [
        (Holding("42", "PENDING", ME), None, "JOB: 42 is PENDING: nothing runs inside it yet"),
        (Holding("42", "COMPLETED", ME), None, f"JOB: 42 is COMPLETED: {GONE}"),
        (Holding("42", "RUNNING", ME + 1, ("node1",)), None, f"JOB: 42 is {OTHERS}"),
        (RUNNING, "node3", "--node: node3 is not one of job 42's nodes (node1, node2)"),
        (RUNNING, "-x", "--node: '-x' is not a node name (e.g. node2)"),
        (RUNNING, "node[1-", "--node: 'node[1-' is not a node name (e.g. node2)"),
        (RUNNING, "node1\nnode2", "--node: 'node1\\\\nnode2' is not a node name (e.g. node2)"),
    ],
)  # fmt: skip
def test_a_job_that_does_not_run_another_users_and_a_node_it_does_not_hold_are_refused(
    tmp_path: Path, held: Holding, node: str | None, said: str
) -> None:
    with pytest.raises(UserError) as refused:
        inside.attach_command(Held(held), _run(tmp_path), node, (), pty=True)
    assert str(refused.value) == said


def test_the_srun_lines_of_a_shell_a_command_and_every_node(tmp_path: Path) -> None:
    run = _run(tmp_path, env={"MY_VAR": "x y"}, venv="/opt/venv")
    argv = inside.attach_command(Held(RUNNING), run, None, (), pty=True)
    beats = str(run.path / "logs" / "attempt-0" / "heartbeats")
    assert argv == [
        "srun", "--jobid=42", "--overlap", "--ntasks-per-node=1", "--nodelist=node1",
        "--nodes=1", "--ntasks=1", "--pty", "--",
        sys.executable, "-m", "clustertrain.node.attach", beats, "--chdir", "/w",
        "--env", "MY_VAR=x y", "--path", "/opt/venv/bin", "--", "bash",
    ]  # fmt: skip
    argv = inside.attach_command(Held(RUNNING), run, "node2", ("ls", "-l; rm"), pty=False)
    assert "--pty" not in argv and "--nodelist=node2" in argv
    assert argv[-3:] == ["--", "ls", "-l; rm"]  # argv, no shell
    every = Held(RUNNING).node_command(run, ["true"])
    assert every == ["srun", "--jobid=42", "--overlap", "--ntasks-per-node=1", "--nodes=2",
                     "--ntasks=2", "--", "true"]  # fmt: skip
    with pytest.raises(UserError, match="is not a node name"):
        SlurmBackend().node_command(run, ["true"], node="--x")


def test_slurms_allocation_names_the_owner_and_each_node() -> None:
    calls: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[:3] == ("scontrol", "show", "hostnames"):
            return subprocess.CompletedProcess(argv, 0, "node1\nnode2\n-x\n", "")
        record = "JobId=42 JobName=t UserId=ann(1001) GroupId=ann(1001) JobState=RUNNING "
        return subprocess.CompletedProcess(argv, 0, record + "NodeList=node[1-2] WorkDir=/w\n", "")

    found = Slurm(runner=runner).holding("42")
    assert found == Holding("42", "RUNNING", 1001, ("node1", "node2"), "/w")  # -x: no name
    assert calls[1] == ("scontrol", "show", "hostnames", "node[1-2]")
    gone = subprocess.CompletedProcess((), 1, "", "slurm_load_jobs error: Invalid job id specified")
    with pytest.raises(UserError, match="Slurm no longer holds this job: it has ended"):
        Slurm(runner=lambda argv: gone).holding("42")
    with pytest.raises(UserError, match="is not a Slurm job id"):
        Slurm(runner=runner).holding("42; reboot")


def test_the_stacks_come_back_grouped_from_a_fresh_folder(tmp_path: Path) -> None:
    run = _run(tmp_path)
    seen: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        out = Path(argv[-1])  # what node.stacks writes on each node
        for rank in range(4):
            (out / f"rank-{rank}.stack").write_text(SLEEPING if rank == 1 else WAITING)
        (out / "rank-x.stack").write_text(SLEEPING)  # not a rank's
        return subprocess.CompletedProcess(argv, 0, "", "")

    taken = inside.stacks(Held(RUNNING), run, runner)
    assert seen[0][:8] == ["srun", "--jobid=42", "--overlap", "--ntasks-per-node=1", "--nodes=2",
                           "--ntasks=2", "--", sys.executable]  # fmt: skip
    assert taken.folder.parent == run.path / "stacks"
    assert [g.head() for g in taken.groups] == [
        "rank 1 (1): <module> (train.py:21)", "ranks 0, 2-3 (3): all_reduce (train.py:88)"
    ]  # fmt: skip
    assert taken.lines()[0].endswith("(by faulthandler for ranks 0-3)")
    assert taken.as_dict()["groups"][0]["ranks"] == [1]


def test_a_forged_stacks_folder_is_refused_and_no_answer_is_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path)
    none = subprocess.CompletedProcess((), 1, "", "srun: error: Unable to create step\n")
    with pytest.raises(UserError, match=r"no rank's stack was taken \(srun: error: Unable"):
        inside.stacks(Held(RUNNING), run, lambda argv: none)
    (run.path / "stacks").rename(run.path / "elsewhere")
    os.symlink(run.path / "elsewhere", run.path / "stacks")
    with pytest.raises(UserError, match="is not a folder clustertrain made"):
        inside.stacks(Held(RUNNING), run, lambda argv: none)

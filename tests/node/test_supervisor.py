"""The job's supervisor (clustertrain.node.supervisor) and its policy (clustertrain.node.policy),
without Slurm: a fake srun, scontrol and scancel record what they are asked, and each scripted run
of the step leaves what a real one would (an exit status, the watchdog's hang report or lost
nodes, a rank's requeue request). Every path that only the end-to-end tests reached when the
policy was a bash program runs here: tests/e2e/test_hang_e2e.py, tests/e2e/test_spare_nodes_e2e.py,
tests/e2e/test_node_failure_e2e.py and tests/e2e/test_preemption.py still run them for real."""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from clustertrain import events, protocol
from clustertrain.node import policy
from clustertrain.node.supervisor import (
    Commands,
    Plan,
    PlanError,
    Supervisor,
    main,
    shell_status,
)

# What a scripted run of the step does: given the supervisor's environment, write what the
# step leaves and return srun's exit status.
Run = Callable[[dict[str, str]], int]
NODES = ["node1", "node2", "node3", "node4"]


class Requeued(Exception):
    """scontrol requeue, which the real supervisor execs: nothing runs after it."""


class FakeProcess:
    def __init__(self, pid: int, status: int) -> None:
        self.pid, self.status = pid, status

    def wait(self) -> int:
        return self.status

    def terminate(self) -> None:
        pass


class FakeSlurm(Commands):
    def __init__(self, env: dict[str, str], runs: list[Run], gone: dict[str, str] | None = None):
        super().__init__(env)
        self.runs, self.gone = list(runs), gone or {}
        self.calls: list[list[str]] = []
        self.rolls: list[list[str]] = []

    def hostnames(self, nodelist: str) -> list[str]:
        return NODES[: int(self.env["ALLOCATED"])]

    def start(self, argv: Any) -> Any:
        argv = list(argv)
        self.calls.append(argv)
        if "clustertrain.node.watchdog" in argv:
            return FakeProcess(2, 0)
        return FakeProcess(1, self.runs.pop(0)(self.env))

    def run(self, argv: Any, cwd: str | None = None, quiet: bool = False) -> int:
        self.calls.append(list(argv))
        return 1 if "nodecheck" in argv and self.env.get("CHECK_FAILS") else 0

    def roll_call(self, nodes: list[str]) -> dict[str, str]:
        self.rolls.append(nodes)
        return {node: why for node, why in self.gone.items() if node in nodes}

    def requeue(self, job_id: str) -> NoReturn:
        self.calls.append(["scontrol", "requeue", job_id])
        raise Requeued


def ok(env: dict[str, str]) -> int:
    return 0


def crash(env: dict[str, str]) -> int:
    _beat(env)
    return 7


def hang(env: dict[str, str]) -> int:
    _beat(env, protocol.HANG_FILE, "hang at step 9: ranks 0-1 in all_reduce (loop.py:133)\n")
    return 143


def lose(*nodes: str) -> Run:
    def run(env: dict[str, str]) -> int:
        _beat(env, protocol.LOST_FILE, "".join(f"{n}\n" for n in nodes))
        return 1

    return run


def checkpoint_and_stop(env: dict[str, str]) -> int:
    Path(env[protocol.ENV_REQUEUE_FILE]).touch()  # runtime.request_requeue
    return 0


def _beat(env: dict[str, str], name: str = "rank-0", text: str = "3\n") -> None:
    folder = Path(env[protocol.ENV_HEARTBEAT_DIR])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


PLAN = {
    "step": ["srun", "--nodes=2", {"expand": "--nodelist=$CLUSTERTRAIN_NODES"}, "bash", "l.sh"],
    "node_check": None,
    "logs_dir": "RUN/logs",
    "nodes": 2,
    "spare_nodes": 0,
    "hang_timeout_s": 60,
    "hang_on_quiet": False,
    "max_restarts": 0,
    "max_requeues": 3,
    "requeue_on_node_failure": False,
    "tasks": None,
}


class Job:
    """One attempt of a job under a fake Slurm, and what it left."""

    def __init__(self, tmp_path: Path, runs: list[Run], attempt: int = 0, **plan: Any) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        raw = {**PLAN, **plan, "logs_dir": str(tmp_path / "logs")}
        if not raw["spare_nodes"]:  # no spares: no --nodelist in the step
            raw["step"] = [w for w in raw["step"] if isinstance(w, str)]
        self.run_dir = tmp_path
        self.env = {
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "node[1-4]",
            "SLURM_RESTART_COUNT": str(attempt),
            "ALLOCATED": str(raw["nodes"] + raw["spare_nodes"]),
            protocol.ENV_EVENTS_FILE: str(tmp_path / "events.jsonl"),
            protocol.ENV_REQUEUE_FILE: str(tmp_path / "requeue-requested"),
            protocol.ENV_OUT_DIR: str(tmp_path / "out"),
        }
        self.slurm = FakeSlurm(self.env, runs, plan.pop("gone", None) if "gone" in plan else None)
        self.out, self.err = io.StringIO(), io.StringIO()
        self.supervisor = Supervisor(Plan.from_dict(raw), self.env, self.slurm, self.out, self.err)

    def run(self) -> int:
        return self.supervisor.run()

    @property
    def events(self) -> list[tuple[str, dict[str, Any]]]:
        """The events, less how long each restart's decision took (a time, checked alone)."""
        found = events.read(self.run_dir / "events.jsonl")
        return [(e.name, {k: v for k, v in e.values.items() if k != "stopped_s"}) for e in found]

    def steps(self) -> list[list[str]]:
        return [c for c in self.slurm.calls if c[0] == "srun" and "nodecheck" not in c]

    def scontrol(self) -> list[list[str]]:
        return [c[2:] for c in self.slurm.calls if c[:2] == ["scontrol", "update"]]


def test_a_clean_step_ends_the_job_with_its_status(tmp_path: Path) -> None:
    job = Job(tmp_path, [ok])
    assert job.run() == 0
    assert job.events == [("started", {"nodes": "node[1-4]"}), ("ended", {"status": "0"})]
    assert job.steps() == [["srun", "--nodes=2", "bash", "l.sh"]]
    assert job.env["HEAD_NODE"] == "node1" and job.env["RDZV_PORT"] == "29542"
    assert job.env["LOG_DIR"] == f"{tmp_path}/logs/attempt-0"
    assert "job 42 attempt 0 on node[1-4], rendezvous node1:29542" in job.out.getvalue()


def test_a_crashed_step_starts_again_on_the_same_nodes_and_keeps_its_heartbeats(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, [crash, ok], max_restarts=1)
    assert job.run() == 0
    assert [name for name, _ in job.events] == ["started", "restarted", "ended"]
    assert job.events[1] == ("restarted", {"why": "crash"})
    restarted = events.read(tmp_path / "events.jsonl")[1]
    assert 0 <= restarted.values["stopped_s"] < 60  # seconds since the step ended, not a time
    said = "the step failed (exit status 7); starting it again on the same nodes (restart 1 of "
    assert said in job.out.getvalue()
    assert (tmp_path / "logs" / "attempt-0" / "heartbeats-failed-1" / "rank-0").exists()
    assert len(job.steps()) == 2


def test_a_crash_with_no_restart_left_ends_with_the_steps_status(tmp_path: Path) -> None:
    job = Job(tmp_path, [crash, crash], max_restarts=1)
    assert job.run() == 7
    assert [name for name, _ in job.events] == ["started", "restarted", "ended"]
    assert job.events[-1] == ("ended", {"status": "7"})
    assert Job(tmp_path / "none", [crash]).run() == 7


def test_a_hung_step_starts_again_then_a_hang_with_none_left_ends_the_job_with_4(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, [hang, hang], max_restarts=1)
    assert job.run() == policy.Exit.HUNG == 4
    assert job.events[1] == ("restarted", {"why": "hang"})
    said = job.out.getvalue()
    assert (
        "the step hung: hang at step 9: ranks 0-1 in all_reduce (loop.py:133); starting it " in said
    )
    assert (tmp_path / "logs" / "attempt-0" / "heartbeats-hung-1" / protocol.HANG_FILE).exists()
    assert job.err.getvalue() == (
        "clustertrain: the step hung and was ended: hang at step 9: ranks 0-1 in all_reduce "
        "(loop.py:133)\n"
    )


def test_a_checkpoint_and_a_requeue_request_requeue_the_job(tmp_path: Path) -> None:
    job = Job(tmp_path, [checkpoint_and_stop], attempt=1)
    with pytest.raises(Requeued):
        job.run()
    # Submitted --no-requeue: not requeueable after a first requeue, made so for this one.
    assert job.scontrol() == [["JobId=42", "Requeue=0"], ["JobId=42", "Requeue=1"]]
    assert job.slurm.calls[-1] == ["scontrol", "requeue", "42"]
    assert [name for name, _ in job.events] == ["started", "requeued"]  # no "ended": requeued
    assert not Path(job.env[protocol.ENV_REQUEUE_FILE]).exists()
    assert "checkpoint taken; requeueing (restart 2 of at most 3)" in job.out.getvalue()


def test_a_requeue_past_max_requeues_ends_the_job_with_3(tmp_path: Path) -> None:
    job = Job(tmp_path, [checkpoint_and_stop], attempt=2, max_requeues=2)
    assert job.run() == policy.Exit.REQUEUE_LIMIT == 3
    assert f"its last checkpoint is in {tmp_path}/out/checkpoints" in job.err.getvalue()
    assert ["scontrol", "requeue", "42"] not in job.slurm.calls


def test_a_job_that_requeues_on_node_failure_is_requeueable_throughout(tmp_path: Path) -> None:
    job = Job(tmp_path, [checkpoint_and_stop], attempt=1, requeue_on_node_failure=True)
    with pytest.raises(Requeued):
        job.run()
    assert job.scontrol() == []


def test_a_requeue_request_wins_over_a_restart(tmp_path: Path) -> None:
    def crash_after_checkpoint(env: dict[str, str]) -> int:
        checkpoint_and_stop(env)
        return 1  # a rank that crashed on its way out cannot turn a clean stop into a failure

    job = Job(tmp_path, [crash_after_checkpoint], max_restarts=3)
    with pytest.raises(Requeued):
        job.run()


@pytest.mark.parametrize(
    ("allocated", "lost", "gone", "next_nodes", "kept"),
    [
        (["node1", "node2", "node3", "node4"], ["node2"], {}, "node1,node3", "node1,node3,node4"),
        (["node1", "node2", "node3"], ["node2"], {}, "node1,node3", "node1,node3"),
        # A spare that does not answer its own roll call is lost too, and not used.
        (["node1", "node2", "node3", "node4"], ["node2"], {"node3": "no answer in 8 s"},
         "node1,node4", "node1,node4"),
    ],
)  # fmt: skip
def test_a_lost_node_is_replaced_by_a_spare_and_let_go(
    tmp_path: Path,
    allocated: list[str],
    lost: list[str],
    gone: dict[str, str],
    next_nodes: str,
    kept: str,
) -> None:
    job = Job(tmp_path, [lose(*lost), ok], spare_nodes=len(allocated) - 2, gone=gone)
    assert job.run() == 0
    first, second = job.steps()
    assert "--nodelist=node1,node2" in first and f"--nodelist={next_nodes}" in second
    assert job.slurm.rolls == [allocated[2:]]  # the spares, asked whether they are there still
    assert job.scontrol() == [["JobId=42", f"NodeList={kept}"]]
    assert job.events[1] == ("restarted", {"why": "node_lost"})
    assert (tmp_path / "logs" / "attempt-0" / "heartbeats-lost-1" / protocol.LOST_FILE).exists()
    said = f"lost node2; starting the step again on {next_nodes} from the last checkpoint"
    assert said in job.out.getvalue()
    for node, why in gone.items():
        assert f"clustertrain: spare {node} is lost too ({why})\n" in job.err.getvalue()


def test_a_lost_node_with_no_spare_left_ends_the_job_with_5(tmp_path: Path) -> None:
    job = Job(tmp_path, [lose("node2"), lose("node3")], spare_nodes=1)
    assert job.run() == policy.Exit.NODE_LOST == 5
    assert [name for name, _ in job.events] == ["started", "restarted", "ended"]
    assert job.scontrol() == [["JobId=42", "NodeList=node1,node3"], ["JobId=42", "NodeList=node1"]]
    assert "lost node3 and no spare node is left: the job ends here" in job.err.getvalue()


def test_a_spare_that_is_gone_too_leaves_none_and_the_end_names_the_steps_node(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, [lose("node2")], spare_nodes=1, gone={"node3": "no answer in 8 s"})
    assert job.run() == policy.Exit.NODE_LOST
    assert job.scontrol() == [["JobId=42", "NodeList=node1"]]
    assert job.err.getvalue().splitlines() == [
        "clustertrain: spare node3 is lost too (no answer in 8 s)",
        f"clustertrain: lost node2 and no spare node is left: the job ends here; its last "
        f"checkpoint is in {tmp_path}/out/checkpoints",
    ]


def test_a_lost_node_with_no_spare_requeues_a_job_that_asks_for_it(tmp_path: Path) -> None:
    job = Job(tmp_path, [lose("node1", "node2")], spare_nodes=1, requeue_on_node_failure=True)
    with pytest.raises(Requeued):
        job.run()
    assert job.events[-1] == ("requeued", {"why": "node_lost"})
    assert job.scontrol() == [["JobId=42", "NodeList=node3"]]  # no Requeue=1: it is requeueable


def test_a_sweeps_task_passes_its_own_arguments_and_an_unknown_task_ends_with_2(
    tmp_path: Path,
) -> None:
    tasks = {"0": ["--lr", "0.1"], "1": ["--lr", "it's $HOME"]}
    job = Job(tmp_path, [ok], tasks=tasks)
    job.env["SLURM_ARRAY_TASK_ID"] = "1"
    assert job.run() == 0
    assert job.steps()[0][-2:] == ["--lr", "it's $HOME"]  # words, never a shell's
    stray = Job(tmp_path / "stray", [ok], tasks=tasks)
    stray.env["SLURM_ARRAY_TASK_ID"] = "7"
    assert stray.run() == policy.Exit.UNKNOWN_TASK == 2
    assert stray.events == [] and "array task 7 is not one of the sweep's" in stray.err.getvalue()


def test_a_failed_node_check_ends_the_job_before_any_step(tmp_path: Path) -> None:
    check = [
        "srun",
        "python",
        "-m",
        "clustertrain.node.nodecheck",
        "probe",
        {"expand": "$LOG_DIR/nc"},
    ]
    job = Job(tmp_path, [ok], node_check=check)
    job.env["CHECK_FAILS"] = "1"
    assert job.run() == 1
    assert job.slurm.calls == [check[:-1] + [f"{tmp_path}/logs/attempt-0/nc"]]
    assert [name for name, _ in job.events] == ["started", "ended"]


def test_the_time_limits_warning_reaches_every_rank_through_scancel(tmp_path: Path) -> None:
    def warned_mid_step(env: dict[str, str]) -> int:
        job.supervisor.warned(signal.SIGUSR2, None)
        return checkpoint_and_stop(env)

    job = Job(tmp_path, [warned_mid_step])
    with pytest.raises(Requeued):
        job.run()
    assert ["scancel", f"--signal={protocol.STOP_SIGNAL}", "42"] in job.slurm.calls
    assert [n for n, _ in job.events] == ["started", "signal", "requeued"]
    assert job.events[1] == ("signal", {"why": "USR2"})


def test_a_step_ended_by_a_signal_ends_the_job_as_a_shell_says_it(tmp_path: Path) -> None:
    job = Job(tmp_path, [lambda env: -signal.SIGTERM])  # srun killed by the watchdog: Popen's -15
    assert job.run() == 143 and job.events[-1] == ("ended", {"status": "143"})
    assert shell_status(-9) == 137 and shell_status(0) == 0 and shell_status(3) == 3


def test_a_cancel_ends_the_attempt_with_its_signals_status(tmp_path: Path) -> None:
    def cancelled(env: dict[str, str]) -> int:
        raise SystemExit(128 + signal.SIGTERM)  # what the SIGTERM handler raises

    job = Job(tmp_path, [cancelled])
    with pytest.raises(SystemExit):
        job.run()
    assert job.events[-1] == ("ended", {"status": "143"})


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({**PLAN, "nodes": "2; rm -rf ~"}),
        json.dumps({**PLAN, "step": ["srun", {"run": "sh"}]}),
        json.dumps({**PLAN, "max_requeues": True}),
        json.dumps({**PLAN, "tasks": {"0": "--lr 1"}}),
        json.dumps({k: v for k, v in PLAN.items() if k != "step"}),
    ],
)
def test_a_plan_that_is_not_the_renderers_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match="not a clustertrain plan"):
        Plan.read(path)
    assert main([str(path)]) == 1


def test_a_plan_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(PLAN))
    assert Plan.read(good).nodes == 2
    (tmp_path / "link.json").symlink_to(good)
    with pytest.raises(PlanError, match="cannot be read"):
        Plan.read(tmp_path / "link.json")


def test_the_policy_never_restarts_past_its_limits() -> None:
    state, rules = policy.State(), policy.Policy(max_restarts=2)
    decisions = [policy.decide(policy.Outcome(9), state, rules, "/o") for _ in range(3)]
    assert [type(d).__name__ for d in decisions] == ["Restart", "Restart", "End"]
    assert decisions[-1] == policy.End(9)
    # Two spares for two lost nodes; the third loss finds none.
    state = policy.State(active=["a", "b"], spares=["c", "d"])
    took = policy.decide(policy.Outcome(1, lost=("a", "b")), state, rules, "/o")
    assert took == policy.Replace(["c", "d"], [], took.message)  # type: ignore[union-attr]
    last = policy.decide(policy.Outcome(1, lost=("c",)), state, rules, "/o")
    assert isinstance(last, policy.End) and last.status == policy.Exit.NODE_LOST


def test_the_batch_script_hands_over_to_the_supervisor_and_holds_no_policy() -> None:
    from tests.render.test_render import render_case

    job = render_case("spares-2x8")
    body = [line for line in job.batch_script.splitlines() if not line.startswith("#")]
    assert body[-1] == f"exec python -m clustertrain.node.supervisor {job.plan_path}"
    text = "\n".join(body)
    for word in ("srun", "scontrol", "requeue ", "while", "if ", "trap", "wait"):
        assert word not in text, word
    assert len(render_case("4x8").batch_script.splitlines()) <= 40
    assert json.loads(job.plan)["spare_nodes"] == 2 and os.path.isabs(job.plan_path)

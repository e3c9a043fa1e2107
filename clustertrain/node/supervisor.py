"""The job's supervisor: what the batch script hands over to, on the allocation's first node.

    python -m clustertrain.node.supervisor RUN_DIR/plan.json

The batch script sets the job's environment and ``exec``s this, so Slurm's warning before the
time limit (``--signal=B:USR2``) reaches it. It runs the node check, then the step (one launch
script per node through srun) with its watchdog beside it (:mod:`clustertrain.node.watchdog`), and
after each run of the step asks :func:`clustertrain.node.policy.decide` what comes next: the step
again on the same nodes or on a spare, a requeue, or the end with a named exit status
(:class:`clustertrain.node.policy.Exit`). It writes the batch side's events (``started``,
``node_check``, ``qualified``, ``flagged``, ``signal``, ``restarted``, ``requeued``, ``ended``).

Every call to Slurm or a process goes through :class:`Commands`, which the tests replace
(tests/node/test_supervisor.py): each path the policy takes runs there without Slurm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from string import Template
from typing import IO, Any, NoReturn

from clustertrain import protocol
from clustertrain.files import read_regular
from clustertrain.node import aftermath, nodecheck, policy, qualify, rollcall
from clustertrain.node.plan import Plan, PlanError, Word
from clustertrain.rank import events


class Commands:
    """Slurm and the processes the supervisor starts, each with the job's environment
    (``env``: what the batch script exported, and the supervisor's own). Tests replace it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def hostnames(self, nodelist: str) -> list[str]:
        argv = ["scontrol", "show", "hostnames", nodelist]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, env=self.env)
        return done.stdout.split()

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), env=self.env)

    def run(self, argv: Sequence[str], cwd: str | None = None, quiet: bool = False) -> int:
        out = subprocess.DEVNULL if quiet else None
        done = subprocess.run(list(argv), cwd=cwd, stdout=out, check=False, env=self.env)
        return shell_status(done.returncode)

    def roll_call(self, nodes: list[str]) -> dict[str, str]:
        return rollcall.call(nodes)

    def requeue(self, job_id: str) -> NoReturn:
        # exec, as the batch script did: nothing of this job may run after Slurm requeues it.
        os.execvpe("scontrol", ["scontrol", "requeue", job_id], self.env)


class Supervisor:
    """One attempt of a job: from its start in the allocation to its end or its requeue."""

    def __init__(
        self,
        plan: Plan,
        environ: dict[str, str],
        commands: Commands,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ) -> None:
        self.plan, self.env, self.commands = plan, environ, commands
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.requeued = False
        self.allocated: list[str] = []
        self.job_id = environ["SLURM_JOB_ID"]
        self.state = policy.State(attempt=int(environ.get("SLURM_RESTART_COUNT") or 0))
        self.events_path = Path(environ[protocol.ENV_EVENTS_FILE])
        self.requeue_file = Path(environ[protocol.ENV_REQUEUE_FILE])
        # The newest checkpoint the job recorded (any attempt): where a restart resumes from.
        self.checkpoint: events.Event | None = None
        self.step_ended = 0.0  # when the last run of the step ended (time.monotonic())

    def say(self, text: str, error: bool = False) -> None:
        print(f"clustertrain: {text}", file=self.err if error else self.out, flush=True)

    def event(self, name: str, **values: str | int | float) -> None:
        events.append(self.events_path, name, self.state.attempt, **values)

    def run(self) -> int:
        """The attempt; returns the job's exit status (a requeue does not return)."""
        task_args = self._task_args()
        if task_args is None:
            return policy.Exit.UNKNOWN_TASK
        self.event(events.STARTED, nodes=self.env["SLURM_JOB_NODELIST"])
        status = 1
        try:
            self._place()
            status = self._node_check()
            if status == 0:
                # The newest checkpoint of an earlier attempt: where this one resumes from.
                size = aftermath.size(self.events_path)
                saved = aftermath.checkpoints(self.events_path, max(0, size - events.MAX_BYTES))
                self.checkpoint = saved[-1] if saved else None
                status = self._steps(task_args)
        except SystemExit as stop:  # SIGTERM (a cancel, the time limit) and the end
            status = stop.code if isinstance(stop.code, int) else 1
            raise
        finally:
            if not self.requeued:  # a requeued attempt has not ended: it is in the queue again
                self.event(events.ENDED, status=str(status))
        return status

    def _task_args(self) -> tuple[str, ...] | None:
        if self.plan.tasks is None:
            return ()
        task = self.env.get("SLURM_ARRAY_TASK_ID", "")
        if task not in self.plan.tasks:
            self.say(f"array task {task} is not one of the sweep's", error=True)
            return None
        return self.plan.tasks[task]

    def _place(self) -> None:
        """The head node, the rendezvous port, the attempt's log folder and, with spares, the
        nodes the step trains on: exported for the launch script and the watchdog."""
        allocated = self.commands.hostnames(self.env["SLURM_JOB_NODELIST"])
        env = self.env
        env["HEAD_NODE"] = allocated[0]
        env["RDZV_PORT"] = str(protocol.rendezvous_port(int(self.job_id)))
        env["LOG_DIR"] = f"{self.expand(self.plan.logs_dir)}/{protocol.ATTEMPT_DIR}"
        env["LOG_DIR"] += str(self.state.attempt)
        env[protocol.ENV_HEARTBEAT_DIR] = f"{env['LOG_DIR']}/{protocol.HEARTBEAT_DIR}"
        if self.plan.spare_nodes:
            self.state.active = allocated[: self.plan.nodes]
            self.state.spares = allocated[self.plan.nodes :]
            env[protocol.ENV_ACTIVE_NODES] = ",".join(self.state.active)
        self.allocated = allocated
        self._to_check(allocated)
        Path(env["LOG_DIR"]).mkdir(parents=True, exist_ok=True)
        self.requeue_file.unlink(missing_ok=True)
        if not self.plan.policy.requeue_on_node_failure and self.state.attempt > 0:
            # Submitted --no-requeue so that a lost node ends the job (NODE_FAIL); the
            # checkpoint requeue made it requeueable for that once: not so again.
            self.commands.run(self._update("Requeue=0"), quiet=True)
        self.say(
            f"job {self.job_id} attempt {self.state.attempt} on {env['SLURM_JOB_NODELIST']}, "
            f"rendezvous {env['HEAD_NODE']}:{env['RDZV_PORT']}"
        )

    def _update(self, *settings: str) -> list[str]:
        return ["scontrol", "update", f"JobId={self.job_id}", *settings]

    def expand(self, word: Word) -> str:
        """A word of the plan: text as is; ``{"expand": ...}`` with this job's variables."""
        if isinstance(word, str):
            return word
        return Template(word["expand"]).substitute(self.env)

    def _node_check(self) -> int:
        """Every node checks that it resolves the head node like the others and that the
        rendezvous port is free: a mistake there would otherwise hang the rendezvous."""
        if self.plan.node_check is None:
            return 0
        started = time.time()
        status = self.commands.run([self.expand(w) for w in self.plan.node_check])
        if status != 0:
            return status
        folder = Path(self.env["LOG_DIR"], protocol.NODE_CHECK_DIR)
        checked = int(self.env[protocol.ENV_CHECK_COUNT]) if self.plan.qualify else self.plan.nodes
        probes = nodecheck.judge(folder, checked, started)
        if probes is None:
            return 1
        self.event(events.NODE_CHECK)
        return self._qualified(probes) if self.plan.qualify else 0

    def _to_check(self, nodes: list[str]) -> None:
        self.env[protocol.ENV_CHECK_NODES] = ",".join(nodes)
        self.env[protocol.ENV_CHECK_COUNT] = str(len(nodes))

    def _requalified(self) -> int:
        """Before a restart inside the allocation, with ``qualify``: the nodes the job still
        holds are qualified again (one may have gone bad since the first step, or be the cause
        of the restart); the probes before are kept in ``node-check-<n>``."""
        if not self.plan.qualify:
            return 0
        held = self.state.active + self.state.spares if self.plan.spare_nodes else self.allocated
        self._to_check(held)
        folder = Path(self.env["LOG_DIR"], protocol.NODE_CHECK_DIR)
        restarts = self.state.step_restarts + self.state.node_restarts
        with contextlib.suppress(FileNotFoundError):
            os.replace(folder, f"{folder}-{restarts}")
        return self._node_check()

    def _qualified(self, probes: list[dict[str, Any]]) -> int:
        """Qualification's verdict carried out: flagged nodes said (an event each, with its
        figure), swapped for spares, or the end (clustertrain.node.policy.qualified)."""
        flagged = qualify.flag(probes, self.plan.compute_threshold, self.plan.link_threshold)
        self.say(f"qualification: {qualify.summary(probes)}")
        self.event(events.QUALIFIED, nodes=" ".join(p["node"] for p in probes),
                   why=f"{len(flagged)} flagged")  # fmt: skip
        for node, why in flagged.items():
            self.event(events.FLAGGED, nodes=node, why=why)
        decision = policy.qualified(flagged, self.state, self.plan.on_flagged)
        if isinstance(decision, policy.End):
            self.say(decision.message or "", error=True)
            return decision.status
        if decision.message:
            self.say(decision.message)
        if self.plan.spare_nodes and flagged:
            self.env[protocol.ENV_ACTIVE_NODES] = ",".join(decision.nodes)
            kept = [*decision.nodes, *decision.spares]
            # Let go of the flagged nodes that are not trained on: another job may have them.
            self.commands.run(self._update(f"NodeList={','.join(kept)}"), self.env["LOG_DIR"], True)
        return 0

    def _steps(self, task_args: tuple[str, ...]) -> int:
        """The step, again after each restart or replacement, until the policy ends the job or
        requeues it."""
        while True:
            outcome = self._step(task_args)
            if outcome.lost:
                outcome = self._let_go(outcome)
            decision = policy.decide(
                outcome, self.state, self.plan.policy, self.env[protocol.ENV_OUT_DIR]
            )
            if isinstance(decision, policy.End):
                if decision.message:
                    self.say(decision.message, error=True)
                if decision.event is not None:
                    self.event(decision.event[0], **decision.event[1])
                return decision.status
            self.say(decision.message)
            if isinstance(decision, policy.Requeue):
                self._requeue(decision)
            elif isinstance(decision, policy.Replace):
                self.env[protocol.ENV_ACTIVE_NODES] = ",".join(decision.nodes)
                self.event(events.RESTARTED, why=events.NODE_LOST, stopped_s=self._since_end())
            else:
                self._keep_heartbeats(decision.keep)
                self.event(events.RESTARTED, why=decision.why, stopped_s=self._since_end())
            if (status := self._requalified()) != 0:
                return status

    def _since_end(self) -> float:
        """Seconds since the step ended: what deciding on a restart took (bench/restart.py)."""
        return round(time.monotonic() - self.step_ended, 3)

    def _step(self, task_args: tuple[str, ...]) -> policy.Outcome:
        """One run of the step, its watchdog beside it; what it left."""
        beats = Path(self.env[protocol.ENV_HEARTBEAT_DIR])
        log_dir = Path(self.env["LOG_DIR"])
        logs, events_at = aftermath.node_logs(log_dir), aftermath.size(self.events_path)
        srun = self.commands.start([*(self.expand(w) for w in self.plan.step), *task_args])
        mode = "quiet" if self.plan.hang_on_quiet else "beats"
        watchdog = self.commands.start(
            [sys.executable, "-m", "clustertrain.node.watchdog", str(beats),
             str(self.plan.hang_timeout_s), str(srun.pid), mode,
             str(self.plan.straggler_threshold), self.plan.straggler_action]
        )  # fmt: skip
        status = shell_status(srun.wait())  # a handler runs, and the wait goes on (PEP 475)
        self.step_ended = time.monotonic()
        watchdog.terminate()
        watchdog.wait()
        hang, lost = beats / protocol.HANG_FILE, beats / protocol.LOST_FILE
        saved = aftermath.checkpoints(self.events_path, events_at)
        before, self.checkpoint = self.checkpoint, saved[-1] if saved else self.checkpoint
        return policy.Outcome(
            status=status,
            hang=_text(hang).strip() if hang.exists() else None,
            lost=tuple(_text(lost).split()) if self.plan.spare_nodes and lost.exists() else (),
            requeue_asked=self.requeue_file.exists(),
            saved=bool(saved) if saved or before is not None else None,
            checkpoint=aftermath.where(self.checkpoint) if self.checkpoint else "",
            no_restart=aftermath.no_restart(log_dir, logs) if status != 0 else None,
        )

    def _let_go(self, outcome: policy.Outcome) -> policy.Outcome:
        """After a node was lost: its heartbeats kept aside, the spares asked whether they are
        there still (they ran nothing since the start), and Slurm told to let go of the lost
        ones (a job holding one stays COMPLETING after its end until Slurm declares it down)."""
        beats = self.env[protocol.ENV_HEARTBEAT_DIR]
        os.replace(beats, f"{beats}-lost-{self.state.node_restarts + 1}")
        gone = self.commands.roll_call(self.state.spares)
        for node, why in gone.items():
            self.say(f"spare {node} is lost too ({why})", error=True)
        lost = [*outcome.lost, *gone]
        kept = [n for n in self.state.active + self.state.spares if n not in lost]
        # scontrol writes its slurm_job_*_resize.sh files in its working directory.
        self.commands.run(self._update(f"NodeList={','.join(kept)}"), self.env["LOG_DIR"], True)
        return dataclasses.replace(outcome, spares_lost=tuple(gone))

    def _keep_heartbeats(self, suffix: str) -> None:
        """A restarted step's heartbeats and stacks stay in ``heartbeats-<suffix>``."""
        beats = self.env[protocol.ENV_HEARTBEAT_DIR]
        with contextlib.suppress(OSError):  # the step never got as far as its first heartbeat
            os.replace(beats, f"{beats}-{suffix}")

    def _requeue(self, decision: policy.Requeue) -> NoReturn:
        self.requeue_file.unlink(missing_ok=True)
        if decision.make_requeueable:
            self.commands.run(self._update("Requeue=1"))
        self.event(events.REQUEUED, **({"why": decision.why} if decision.why else {}))
        self.requeued = True
        self.commands.requeue(self.job_id)

    def warned(self, signum: int, frame: Any) -> None:
        """Slurm warns this process only (--signal=B:USR2) before the time limit: pass the
        warning on to every rank (scancel signals the job's steps). A rank that handles it
        checkpoints, asks for a requeue and exits; a user's `scancel --signal=USR2 JOB` reaches
        the ranks directly and ends the same way."""
        self.event(events.SIGNAL, why=protocol.STOP_SIGNAL)
        self.say("warning signal: asking every rank to checkpoint and stop")
        self.commands.run(["scancel", f"--signal={protocol.STOP_SIGNAL}", self.job_id])


def shell_status(returncode: int) -> int:
    """A process's status as a shell says it: one ended by signal N is 128 + N (Python says
    -N), so that the job's exit status and its ``ended`` event read as they always have."""
    return 128 - returncode if returncode < 0 else returncode


def _text(path: Path) -> str:
    return read_regular(path, 64 << 10).decode("utf-8", "replace")


def _ended(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m clustertrain.node.supervisor PLAN", file=sys.stderr)
        return 2
    try:
        plan = Plan.read(Path(argv[0]))
    except (PlanError, OSError) as exc:
        print(f"clustertrain: {exc}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    supervisor = Supervisor(plan, env, Commands(env))
    signal.signal(getattr(signal, f"SIG{protocol.STOP_SIGNAL}"), supervisor.warned)
    signal.signal(signal.SIGTERM, _ended)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

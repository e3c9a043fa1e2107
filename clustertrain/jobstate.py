"""What every backend's jobs look like from outside: their ids and their states.

A Slurm job is ``N`` (an array's task ``N_M``); a local run is ``local-<pid>``. Only such ids
reach a scheduler's commands or a run folder's lookup. The states are Slurm's words, which
local runs use too.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

# Slurm job ids, and array tasks (N_M): nothing else reaches a Slurm command.
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")


LOCAL_ID = re.compile(r"local-[0-9]{1,10}")
# Each backend's ids, by the name a run folder records (job.json's "backend"): a run's id is
# checked against its own backend's, never used to tell which backend owns it.
# A login node's ("ssh") are its Slurm's.
JOB_IDS = {"slurm": JOB_ID, "local": LOCAL_ID, "ssh": JOB_ID}
# A state as squeue and sacct print it (CANCELLED+, OUT_OF_MEMORY), never more.
STATE = re.compile(r"[A-Z_]{1,32}\+?")
_TEXT_MAX = 1024

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)


# Where a state came from (JobState.source): Slurm's controller (scontrol), its accounting
# (sacct, or its completion log) once the controller has forgotten the job, the run folder's
# events when Slurm cannot be asked at all (clustertrain.runs.folderstate), a local run's
# supervisor (local.json).
SLURM, SACCT, RUN_FOLDER, LOCAL = "slurm", "sacct", "run folder", "local"
SOURCES = (SLURM, SACCT, RUN_FOLDER, LOCAL)


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    nodes: str = ""
    elapsed: str = ""
    restarts: int = 0
    exit_code: str = ""
    reason: str = ""
    # A job array's tasks (number, state); empty for a job or one task.
    tasks: tuple[tuple[int, str], ...] = ()
    source: str = SLURM  # one of SOURCES

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def counts(self) -> str:
        """``2 RUNNING, 4 PENDING``: the array's tasks per state."""
        seen: dict[str, int] = {}
        for _, state in self.tasks:
            seen[state] = seen.get(state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in seen.items())

    def as_dict(self) -> dict[str, Any]:
        """The state as ``status --json`` prints it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> JobState:
        """A state another clustertrain printed (``status --json`` on a login node), every value
        checked: raises ValueError for anything that is not one."""
        if not isinstance(data, dict) or set(data) - {f.name for f in fields(cls)}:
            raise ValueError("not a job state")
        job_id, state, restarts = data.get("job_id"), data.get("state"), data.get("restarts", 0)
        if not isinstance(job_id, str) or not (
            JOB_ID.fullmatch(job_id) or LOCAL_ID.fullmatch(job_id)
        ):
            raise ValueError(f"bad job id {job_id!r:.40}")
        if not isinstance(state, str) or not STATE.fullmatch(state):
            raise ValueError(f"bad state {state!r:.40}")
        if (
            isinstance(restarts, bool)
            or not isinstance(restarts, int)
            or not 0 <= restarts < 1 << 31
        ):
            raise ValueError(f"bad restart count {restarts!r:.40}")
        texts = {name: data.get(name, "") for name in ("nodes", "elapsed", "exit_code", "reason")}
        for name, text in texts.items():
            if not isinstance(text, str) or len(text) > _TEXT_MAX or not text.isprintable():
                raise ValueError(f"bad {name} {text!r:.40}")
        tasks = data.get("tasks", [])
        if not isinstance(tasks, list) or not all(_task(task) for task in tasks):
            raise ValueError("bad tasks")
        source = data.get("source", SLURM)
        if source not in SOURCES:
            raise ValueError(f"bad source {source!r:.40}")
        found = tuple((int(n), str(s)) for n, s in tasks)
        return cls(job_id, state, restarts=restarts, tasks=found, source=source, **texts)


def _task(task: Any) -> bool:
    return (
        isinstance(task, list | tuple)
        and len(task) == 2
        and type(task[0]) is int
        and 0 <= task[0] < 1 << 31
        and isinstance(task[1], str)
        and STATE.fullmatch(task[1]) is not None
    )


@dataclass(frozen=True)
class StepUsage:
    """One step of a job as accounting recorded it (sacct's row for ``N.batch``, ``N.0``...)."""

    step: str
    state: str
    exit_code: str = ""
    elapsed_s: int = 0
    max_rss_kb: int | None = None  # the largest task's resident memory, where measured
    total_cpu_s: float | None = None

    def line(self) -> str:
        """``step 0: COMPLETED, exit code 0:0, 7 s, MaxRSS 109.9 MiB, CPU time 0.3 s``."""
        said = [f"{_word(self.state)}", f"exit code {_exit_code(self.exit_code)}"]
        said.append(f"{self.elapsed_s} s")
        if self.max_rss_kb is not None:
            said.append(f"MaxRSS {self.max_rss_kb / 1024:.1f} MiB")
        if self.total_cpu_s is not None:
            said.append(f"CPU time {self.total_cpu_s:.1f} s")
        return f"step {_word(self.step, 'step')}: " + ", ".join(said)


def _word(text: str, what: str = "state") -> str:
    """A state or step name read back from the scheduler, shown only when it is one."""
    return text if re.fullmatch(r"[A-Za-z0-9_+.]{1,32}", text) else f"(an unreadable {what})"


def _exit_code(text: str) -> str:
    return text if re.fullmatch(r"[0-9]{1,3}:[0-9]{1,3}", text) else "unknown"


@dataclass(frozen=True)
class Accounting:
    """What a backend's accounting knows of a job once the scheduler is done with it: its state,
    exit code and elapsed time, and each step's use (Slurm: sacct). The backends without such
    a record answer None (:meth:`clustertrain.backends.base.Backend.accounting`)."""

    job_id: str
    state: str
    exit_code: str = ""
    elapsed_s: int = 0
    steps: tuple[StepUsage, ...] = ()
    # Who cancelled it, as sacct says ("CANCELLED by 1000": the uid), where one did.
    cancelled_by: str = ""
    # The nodes Slurm recorded going down while the job held them, where it ended NODE_FAIL
    # (Slurm: its node events). srun's "Node failure on" is a message Slurm may never deliver.
    lost_nodes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What ``status`` prints of it: the job's exit code and time, then each step's use."""
        head = (
            f"accounting (sacct): {_word(self.state)}, exit code {_exit_code(self.exit_code)}, "
            f"{self.elapsed_s} s"
        )
        return [head, *(f"  {step.line()}" for step in self.steps)]


@dataclass(frozen=True)
class Allocation:
    """One allocation of a job as accounting recorded it: a requeued job has one per attempt
    (``sacct -X --duplicates``), an array one per task. A time is seconds since the epoch; None
    where accounting has none yet (``Unknown``: not started, still running) or where what it
    printed could not be read, which ``unreadable`` then names (sacct's field names)."""

    job_id: str
    state: str
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    elapsed_s: int | None = None
    nodes: int | None = None
    # GPUs allocated: AllocTRES's gres/gpu, where the cluster accounts for them
    # (AccountingStorageTRES=gres/gpu); None where AllocTRES names none.
    gpus: int | None = None
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Holding:
    """What a command inside a job needs from its scheduler (``Backend.holding``): its state,
    whose it is, the nodes it holds (each a plain name) and where it runs."""

    job_id: str
    state: str
    uid: int | None  # None where the scheduler did not say
    nodes: tuple[str, ...] = ()
    workdir: str = ""

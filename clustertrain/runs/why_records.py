"""The records a failed job's cause is read from (:mod:`clustertrain.runs.why`): each writer's
last lines, its launcher's report, and the job's own (Slurm's state, accounting, the events);
typed, frozen, and shared by the reader and the texts (:mod:`clustertrain.runs.why_texts`)."""

from __future__ import annotations

from dataclasses import dataclass

from clustertrain.files import printable
from clustertrain.jobstate import SLURM, Accounting
from clustertrain.runs.why_kinds import Finding


@dataclass(frozen=True)
class Tail:
    """The last lines of one writer of a node's log: a rank's (``rank``; torch 1.x names only
    the ``local`` rank), or the launcher's own (both None)."""

    node: str
    rank: int | None
    lines: tuple[str, ...]
    local: int | None = None


@dataclass(frozen=True)
class Exit:
    """A rank's end as its launcher's failure report (torchelastic's root cause) gives it."""

    node: str
    rank: int
    exit_code: int
    time: str = ""


@dataclass(frozen=True)
class Records:
    """What a failed run's records say, as :func:`cause` reads them: Slurm's ``state`` (and
    where it came from: its ``source``), ``reason``, ``exit_code`` and ``elapsed``; each
    writer's last lines (``tails``) and the launchers' reports (``exits``) of the newest
    attempt, its ``nodes`` and ``world_size``; the batch shell's last stderr lines (``batch``:
    srun's and slurmstepd's words); Slurm's ``accounting``; the watchdog's ``hang`` verdict,
    the ``lost_nodes``, the failed ``setup`` line; from the events, the supervisor's ``ended``
    status, the ``requeues`` and the ``last_metric``; who cancelled it (``cancelled_by``); the
    supervisor's end without a restart: a restart ``storm`` (its restarts, and where the last
    checkpoint stands) or a rank that asked for ``no_restart`` (its rank and node)."""

    job_id: str = ""
    state: str = "UNKNOWN"
    source: str = SLURM
    reason: str = ""
    exit_code: str = ""
    elapsed: str = ""
    tails: tuple[Tail, ...] = ()
    exits: tuple[Exit, ...] = ()
    nodes: tuple[str, ...] = ()
    world_size: int = 0
    batch: tuple[str, ...] = ()
    accounting: Accounting | None = None
    hang: str | None = None
    lost_nodes: tuple[str, ...] = ()
    setup: str | None = None
    ended: str | None = None
    requeues: int = 0
    last_metric: str | None = None
    cancelled_by: str | None = None
    storm: tuple[int, str] | None = None
    no_restart: tuple[int, str] | None = None


@dataclass(frozen=True)
class End:
    """How one writer ended: its finding, its lines and its launcher's report of it."""

    node: str
    rank: int | None
    local: int | None
    finding: Finding
    lines: tuple[str, ...] = ()
    exit: Exit | None = None

    def who(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank} on {printable(self.node)}"
        if self.local is not None:
            return f"local rank {self.local} on {printable(self.node)}"
        return f"the launcher on {printable(self.node)}"

    def label(self) -> str:
        """``node1 rank3``, as ``logs`` labels the writer's lines."""
        who = (
            f"rank{self.rank}"
            if self.rank is not None
            else (f"local{self.local}" if self.local is not None else "launcher")
        )
        return f"{printable(self.node)} {who}"

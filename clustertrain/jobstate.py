"""What every backend's jobs look like from outside: their ids and their states.

A Slurm job is ``N`` (an array's task ``N_M``); a local run is ``local-<pid>``. Only such ids
reach a scheduler's commands or a run folder's lookup. The states are Slurm's words, which
local runs use too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Slurm job ids, and array tasks (N_M): nothing else reaches a Slurm command.
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")


LOCAL_ID = re.compile(r"local-[0-9]{1,10}")

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

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def counts(self) -> str:
        """``2 RUNNING, 4 PENDING``: the array's tasks per state."""
        seen: dict[str, int] = {}
        for _, state in self.tasks:
            seen[state] = seen.get(state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in seen.items())

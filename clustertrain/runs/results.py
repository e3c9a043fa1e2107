"""``clustertrain results ID``: one row per task of a sweep, best first by the job's headline
metric (its ``metric``, better by ``metric_mode``).

Each row comes from the task's own folder (its events: the headline's newest value, its
attempts) and the array's state in Slurm; a task Slurm no longer remembers keeps what its folder
says. A job that names no headline metric lists its tasks in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from clustertrain.files import printable
from clustertrain.jobstate import JobState
from clustertrain.runs import Run, sweeps, task, timeline


@dataclass(frozen=True)
class Row:
    task: int
    params: dict[str, str]
    state: str
    metric: str | None
    value: float | None
    restarts: int


def rows(run: Run, state: JobState, warn: Callable[[str], None] | None = None) -> list[Row]:
    """The tasks of ``run``, best headline first (unfinished or unmeasured last)."""
    table = sweeps.read_table(run.path)
    states = dict(state.tasks)
    found = []
    for number in sorted(table):
        view = task(run, number)
        seen = view.events(warn)
        found.append(
            Row(
                task=number,
                params=table[number],
                state=states.get(number, state.state if not state.tasks else "UNKNOWN"),
                metric=run.metric,
                value=timeline.latest(seen, run.metric),
                restarts=max(len(timeline.attempts(seen)) - 1, 0),
            )
        )
    sign = -1.0 if run.metric_mode == "max" else 1.0
    return sorted(found, key=lambda r: (r.value is None, sign * (r.value or 0.0), r.task))


def text(found: list[Row]) -> str:
    names = list(found[0].params) if found else []
    metric = found[0].metric if found else None
    head = ["task", *names, "state", *([printable(metric)] if metric else []), "restarts"]
    body = [
        [
            str(r.task),
            *(printable(r.params.get(n, "")) for n in names),
            r.state,
            *([f"{r.value:.6g}" if r.value is not None else "-"] if metric else []),
            str(r.restarts),
        ]
        for r in found
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [head, *body]
    )


def as_json(found: list[Row]) -> str:
    return json.dumps([asdict(r) for r in found], indent=1, allow_nan=False)

"""``clustertrain results ID``: one row per task of a sweep, best accuracy first.

Each row comes from the task's own folder (its closing metrics record and its events) and the
array's state in Slurm; a task Slurm no longer remembers keeps what its folder says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from clustertrain.files import printable
from clustertrain.jobstate import JobState
from clustertrain.runs import Run, task, timeline
from clustertrain.spec import sweep


@dataclass(frozen=True)
class Row:
    task: int
    params: dict[str, str]
    state: str
    test_acc: float | None
    time_to_target_s: float | None
    restarts: int


def rows(run: Run, state: JobState, warn: Callable[[str], None] | None = None) -> list[Row]:
    """The tasks of ``run``, sorted by final accuracy (best first; unfinished last)."""
    table = sweep.read_table(run.path)
    states = dict(state.tasks)
    found = []
    for number in sorted(table):
        view = task(run, number)
        final = view.final_metrics() or {}
        attempts = timeline.attempts(view.events(warn))
        found.append(
            Row(
                task=number,
                params=table[number],
                state=states.get(number, state.state if not state.tasks else "UNKNOWN"),
                test_acc=_number(final.get("test_acc")),
                time_to_target_s=_number(final.get("time_to_target_s")),
                restarts=max(len(attempts) - 1, 0),
            )
        )
    return sorted(found, key=lambda r: (r.test_acc is None, -(r.test_acc or 0.0), r.task))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def text(found: list[Row]) -> str:
    names = list(found[0].params) if found else []
    head = ["task", *names, "state", "test acc.", "time to target", "restarts"]
    body = [
        [
            str(r.task),
            *(printable(r.params.get(n, "")) for n in names),
            r.state,
            f"{100 * r.test_acc:.2f} %" if r.test_acc is not None else "-",
            f"{r.time_to_target_s:.1f} s" if r.time_to_target_s is not None else "-",
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
    return json.dumps([asdict(r) for r in found], indent=1)

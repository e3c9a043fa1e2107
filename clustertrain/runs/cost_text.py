"""What ``clustertrain report`` prints of a :class:`clustertrain.runs.cost.Cost`: a job's
figures and badput a line each, a sweep's or a period's table with its total, and the rows as
CSV or JSON (:data:`clustertrain.runs.cost.COLUMNS`) for pandas. Every text read from a run
folder or a scheduler is escaped (:func:`clustertrain.files.printable`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from clustertrain.files import printable
from clustertrain.runs.cost import COLUMNS, Cost
from clustertrain.runs.timeline import duration


def lines(cost: Cost) -> list[str]:
    """One job: its head line, then its figures, its goodput and each badput bucket, then
    what is not known and why."""
    head = (
        f"job {cost.job_id} ({printable(cost.name)}): {printable(cost.state)}, "
        f"{_plural(cost.attempts, 'attempt')}, {_plural(cost.restarts, 'restart')} "
        f"(figures from {cost.source})"
    )
    said = [head]
    figures = [
        ("queue wait", _span(cost.queue_wait_s)),
        ("wall time", _wall(cost)),
        ("node-hours", _per(cost.node_hours, cost.nodes, "node")),
        ("GPU-hours", _per(cost.gpu_hours, cost.gpus, "GPU")),
        ("goodput", _goodput(cost)),
    ]
    said += [f"  {name:<12} {value}" for name, value in figures if value is not None]
    wall = cost.productive_s + sum(s for _, s in cost.badput)
    if cost.goodput is not None and wall > 0:
        said.append("  badput:")
        said += [
            f"    {name:<20} {duration(seconds):>8} {100 * seconds / wall:5.1f}%"
            for name, seconds in cost.badput
        ]
    return said + [f"  {printable(line)}" for line in cost.missing]


def table(total: Cost, what: str) -> list[str]:
    """A sweep's or a period's parts, a row each, then their total and what it lacks."""
    rows: list[tuple[str, ...]] = [
        ("job", "state", "queue wait", "wall time", "node-h", "GPU-h", "goodput", "name")
    ]
    for part in total.parts:
        rows.append(_row(part))
    rows.append(_row(total, "total"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    said = [f"{what}: {_plural(len(total.parts), 'job')}, figures from {total.source}"]
    said += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    if total.goodput is not None:
        wall = total.productive_s + sum(s for _, s in total.badput)
        said.append(
            "  badput in all: "
            + ", ".join(
                f"{name} {duration(s)} ({100 * s / wall:.1f}%)" for name, s in total.badput if s
            )
        )
    return said + [f"  {printable(line)}" for line in total.missing]


def _row(cost: Cost, job: str | None = None) -> tuple[str, ...]:
    return (
        job or cost.job_id,
        printable(cost.state) if job is None else "",
        _span(cost.queue_wait_s) or "-",
        _span(cost.wall_s) or "-",
        _number(cost.node_hours),
        _number(cost.gpu_hours),
        f"{100 * cost.goodput:.1f}%" if cost.goodput is not None else "-",
        printable(cost.name) if job is None else "",
    )


def as_csv(costs: Sequence[Cost]) -> str:
    """A header of :data:`COLUMNS`, then a row per job."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for cost in costs:
        writer.writerow({k: "" if v is None else v for k, v in cost.row().items()})
    return out.getvalue()


def as_json(costs: Sequence[Cost]) -> str:
    """A list of rows, each an object of :data:`COLUMNS` (null: not known)."""
    return json.dumps([cost.row() for cost in costs], indent=1)


def _span(seconds: float | None) -> str | None:
    return None if seconds is None else duration(seconds)


def _wall(cost: Cost) -> str | None:
    if cost.wall_s is None:
        return None
    allocated = f"; {duration(cost.allocated_s)} allocated" if cost.allocated_s is not None else ""
    return f"{duration(cost.wall_s)} (first start to last end{allocated})"


def _per(hours: float | None, count: int | None, what: str) -> str | None:
    if hours is None:
        return None
    return f"{hours:.2f}" + (f" ({_plural(count, what)})" if count is not None else "")


def _goodput(cost: Cost) -> str | None:
    if cost.goodput is None:
        return None
    return f"{100 * cost.goodput:.1f}% ({duration(cost.productive_s)} of productive training)"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")

"""What a job cost, and its goodput: one typed answer (:class:`Cost`) from the records
``status`` reads, which ``clustertrain report`` and ``Job.cost()`` print.

Where the scheduler's accounting kept the job (Slurm: ``sacct``'s allocations, every attempt
and every task of an array), its queue wait, wall time and node- and GPU-hours are accounting's
(``ElapsedRaw`` x ``AllocTRES``'s ``node`` and ``gres/gpu``). Where it did not (no slurmdbd, a
local run, a login node's job), they are the run folder's, and each figure only accounting
knows says so in a line. Goodput and its badput buckets always come from the run folder's
events (:mod:`clustertrain.runs.goodput`), over the wall time from the first start to the last
end; what the events do not see of it is ``other``. Pure: records in, a :class:`Cost` out.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from clustertrain.errors import UserError
from clustertrain.jobstate import RUN_FOLDER, SACCT, Allocation
from clustertrain.rank.events import Event
from clustertrain.runs import folderstate
from clustertrain.runs.folder import Run
from clustertrain.runs.folder import tasks as sweep_tasks
from clustertrain.runs.goodput import BUCKETS, Goodput, goodput
from clustertrain.runs.timeline import duration

OTHER = "other"
# report --format csv|json: one row per job, these columns, in this order (docs/report.md).
COLUMNS = (
    "job_id", "name", "submitted_at", "state", "source", "attempts", "restarts",
    "queue_wait_s", "wall_s", "allocated_s", "nodes", "gpus", "node_hours", "gpu_hours",
    "folder_node_hours", "folder_process_hours", "goodput", "productive_s",
    *(f"badput_{key}_s" for key in (*BUCKETS.values(), OTHER)),
    "missing",
)  # fmt: skip


@dataclass(frozen=True)
class Cost:
    """A job's cost and goodput. ``source``: where the queue wait, wall time and hours came
    from (``sacct`` or ``run folder``); a figure that is None is not known, and ``missing``
    says why, a line each. For a sweep (or a period), ``parts`` holds each job's own and the
    figures are their sums."""

    job_id: str
    name: str
    submitted_at: str
    state: str
    source: str
    attempts: int = 0
    restarts: int = 0
    queue_wait_s: float | None = None
    wall_s: float | None = None
    allocated_s: float | None = None
    nodes: int | None = None
    gpus: int | None = None
    node_hours: float | None = None
    gpu_hours: float | None = None
    # The run folder's own estimate, accounting or not: its nodes (processes) x its attempts.
    folder_node_hours: float | None = None
    folder_process_hours: float | None = None
    goodput: float | None = None
    productive_s: float = 0.0
    badput: tuple[tuple[str, float], ...] = ()  # BUCKETS and OTHER, seconds
    missing: tuple[str, ...] = ()
    parts: tuple[Cost, ...] = ()
    # Why accounting did not answer, where it did not ("no accounting: a local run").
    no_accounting: str = ""

    def row(self) -> dict[str, str | int | float | None]:
        """Its :data:`COLUMNS` (``missing`` joined with ``; ``), for a CSV or JSON row."""
        buckets = dict(self.badput)
        row: dict[str, str | int | float | None] = {
            name: getattr(self, name) for name in COLUMNS[: COLUMNS.index("productive_s") + 1]
        }
        for name, key in (*BUCKETS.items(), (OTHER, OTHER)):
            row[f"badput_{key}_s"] = round(buckets[name], 3) if name in buckets else None
        row["missing"] = "; ".join(self.missing)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}


def cost(
    run: Run,
    found: list[Event],
    allocations: tuple[Allocation, ...] | None,
    now: float,
    no_accounting: str = "no accounting",
) -> Cost:
    """``run``'s cost from its events ``found`` and what accounting kept of its
    ``allocations`` (None: none kept, for the reason ``no_accounting`` says)."""
    spent = goodput(found)
    mine = tuple(a for a in allocations or () if a.job_id == run.job_id)
    if allocations is not None and not mine:
        no_accounting = "accounting has no record of it yet"
    folder = _from_folder(run, spent, found, now)
    if not mine:
        missing: tuple[str, ...] = (
            f"node-hours: not known ({no_accounting}); from the run folder: "
            f"{_hours(folder.folder_node_hours)} ({run.nodes} node(s) x "
            f"{duration(spent.allocated_s)} in its attempts)",
            f"GPU-hours: not known ({no_accounting}); from the run folder: "
            f"{_hours(folder.folder_process_hours)} process-hours ({run.world_size} "
            f"process(es), a GPU each on a GPU job)",
        )
        if spent.queue_wait_s is None:
            missing += (f"queue wait: not known ({no_accounting}; no queued and started events)",)
        return _with_goodput(replace(folder, missing=missing, no_accounting=no_accounting), spent)
    return _with_goodput(_from_accounting(folder, mine, spent), spent)


def of_run(
    run: Run,
    allocations: tuple[Allocation, ...] | None,
    now: float,
    no_accounting: str,
    warn: Callable[[str], None] | None = None,
) -> Cost:
    """:func:`cost` of ``run`` from its events, or for a sweep the :func:`total` of its tasks'
    (an array's allocations are its tasks')."""
    tasks = sweep_tasks(run)
    if not tasks:
        return cost(run, run.events(warn), allocations, now, no_accounting)
    parts = [cost(t, t.events(warn), allocations, now, no_accounting) for t in tasks]
    return total(run.job_id, run.name, parts, run.submitted_at)


def _from_folder(run: Run, spent: Goodput, found: list[Event], now: float) -> Cost:
    hours = spent.allocated_s / 3600
    return Cost(
        job_id=run.job_id,
        name=run.name,
        submitted_at=run.submitted_at,
        state=folderstate.implied(run.job_id, found, now).state,
        source=RUN_FOLDER,
        attempts=spent.attempts,
        restarts=spent.restarts,
        queue_wait_s=spent.queue_wait_s,
        wall_s=spent.wall_s,
        allocated_s=spent.allocated_s if spent.attempts else None,
        nodes=run.nodes,
        folder_node_hours=hours * run.nodes if spent.attempts else None,
        folder_process_hours=hours * run.world_size if spent.attempts else None,
    )


def _from_accounting(folder: Cost, mine: tuple[Allocation, ...], spent: Goodput) -> Cost:
    """The figures accounting knows, each with the run folder's where it could not be read."""
    missing: list[str] = []
    first, ends = mine[0], [_end(a) for a in mine]
    wait = _span(first.submit, first.start)
    if wait is None:
        missing.append(_unreadable("queue wait", first, ("Submit", "Start"),
                                   duration(spent.queue_wait_s)))  # fmt: skip
    wall = _span(first.start, ends[-1])
    if wall is None:
        missing.append(_unreadable("wall time", first, ("Start", "End"), duration(spent.wall_s)))
    elapsed = [a.elapsed_s for a in mine]
    allocated = float(sum(e or 0 for e in elapsed)) if None not in elapsed else None
    node_hours = _hours_of(mine, "nodes")
    gpu_hours = _hours_of(mine, "gpus")
    if node_hours is None:
        missing.append(_unreadable("node-hours", first, ("ElapsedRaw", "AllocTRES"),
                                   _hours(folder.folder_node_hours)))  # fmt: skip
    if gpu_hours is None:
        missing.append(_no_gpus(mine, folder))
    return replace(
        folder,
        state=mine[-1].state,
        source=SACCT,
        # A requeue is a record of its own, and so is a job resized after losing a node: the
        # run folder's attempts, where its events say them.
        attempts=folder.attempts or len(mine),
        queue_wait_s=wait,
        wall_s=wall,
        allocated_s=allocated,
        nodes=max((a.nodes for a in mine if a.nodes is not None), default=None),
        gpus=max((a.gpus for a in mine if a.gpus is not None), default=None),
        node_hours=node_hours,
        gpu_hours=gpu_hours,
        missing=tuple(missing),
    )


def _end(allocation: Allocation) -> float | None:
    """Its end, or for one still running, its start and the time it has run."""
    if allocation.end is not None or allocation.start is None or allocation.elapsed_s is None:
        return allocation.end
    return allocation.start + allocation.elapsed_s


def _span(start: float | None, end: float | None) -> float | None:
    return end - start if start is not None and end is not None and end >= start else None


def _hours_of(mine: tuple[Allocation, ...], what: str) -> float | None:
    """Sum of ElapsedRaw x the allocation's ``what`` (nodes, gpus), in hours; None when one
    of them is not known."""
    counts = [getattr(a, what) for a in mine]
    if None in counts or any(a.elapsed_s is None for a in mine):
        return None
    return sum((a.elapsed_s or 0) * n for a, n in zip(mine, counts, strict=True)) / 3600


def _unreadable(what: str, first: Allocation, fields: tuple[str, str], folder: str) -> str:
    named = [f for f in fields if f in first.unreadable]
    why = f"unreadable (sacct's {' and '.join(named)})" if named else "not known yet"
    return f"{what}: {why}; from the run folder: {folder}"


def _no_gpus(mine: tuple[Allocation, ...], folder: Cost) -> str:
    estimate = f"{_hours(folder.folder_process_hours)} process-hours"
    if any("AllocTRES" in a.unreadable or "ElapsedRaw" in a.unreadable for a in mine):
        return f"GPU-hours: unreadable (sacct's AllocTRES or ElapsedRaw); from the run folder: " \
               f"{estimate}"  # fmt: skip
    return (
        "GPU-hours: not known (sacct's AllocTRES names no gres/gpu: none allocated, or the "
        f"cluster does not account for GPUs: AccountingStorageTRES=gres/gpu); from the run "
        f"folder: {estimate}"
    )


def _with_goodput(found: Cost, spent: Goodput) -> Cost:
    """Goodput over the wall time (accounting's where known): what the events do not see of
    it is ``other``."""
    wall = found.wall_s if found.wall_s is not None else spent.wall_s
    buckets = dict(spent.badput)
    other = max(0.0, (wall or 0.0) - spent.productive_s - sum(buckets.values()))
    missing = found.missing
    ratio = None
    if wall and spent.attempts and math.isfinite(wall):
        ratio = min(1.0, max(0.0, spent.productive_s / wall))
    else:
        missing += ("goodput: not known (no attempt in the run folder's events)",)
    return replace(
        found,
        goodput=ratio,
        productive_s=spent.productive_s,
        badput=(*buckets.items(), (OTHER, other)),
        missing=missing,
    )


def _hours(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def total(job_id: str, name: str, parts: Sequence[Cost], submitted_at: str = "") -> Cost:
    """A sweep's (or a period's) cost: the sums of its ``parts``' figures, and goodput as their
    productive time over their wall time. A figure some part lacks sums the parts that have it,
    and says so in a line."""
    missing = []
    sums: dict[str, float | None] = {}
    for figure, said in _SUMMED.items():
        known = [getattr(p, figure) for p in parts if getattr(p, figure) is not None]
        sums[figure] = sum(known) if known else None
        if known and len(known) < len(parts):
            missing.append(f"{said}: known for {len(known)} of {len(parts)} (the total sums those)")
        elif parts and not known:
            why = "; ".join(sorted({p.no_accounting for p in parts if p.no_accounting})[:2])
            missing.append(f"{said}: not known for any of the {_jobs(len(parts))}"
                           + (f" ({why})" if why else ""))  # fmt: skip
    timed = [p for p in parts if p.goodput is not None]
    wall = sum(p.productive_s + sum(s for _, s in p.badput) for p in timed)
    badput = {b: sum(dict(p.badput).get(b, 0.0) for p in timed) for b in (*BUCKETS, OTHER)}
    sources = {p.source for p in parts}
    return Cost(
        job_id=job_id,
        name=name,
        submitted_at=submitted_at,
        state=", ".join(f"{n} {s}" for s, n in Counter(p.state for p in parts).items()),
        source=sources.pop() if len(sources) == 1 else "mixed" if sources else "",
        attempts=sum(p.attempts for p in parts),
        restarts=sum(p.restarts for p in parts),
        goodput=sum(p.productive_s for p in timed) / wall if wall > 0 else None,
        productive_s=sum(p.productive_s for p in timed),
        badput=tuple(badput.items()),
        missing=tuple(missing),
        parts=tuple(parts),
        queue_wait_s=sums["queue_wait_s"],
        wall_s=sums["wall_s"],
        allocated_s=sums["allocated_s"],
        node_hours=sums["node_hours"],
        gpu_hours=sums["gpu_hours"],
        folder_node_hours=sums["folder_node_hours"],
        folder_process_hours=sums["folder_process_hours"],
    )


# The figures a total sums, with the name a line says.
_SUMMED = {
    "queue_wait_s": "queue wait",
    "wall_s": "wall time",
    "allocated_s": "allocated time",
    "node_hours": "node-hours",
    "gpu_hours": "GPU-hours",
    "folder_node_hours": "the run folders' node-hours",
    "folder_process_hours": "the run folders' process-hours",
}


def _jobs(count: int) -> str:
    return f"{count} job" + ("" if count == 1 else "s")


_PERIOD = re.compile(r"([0-9]{1,6})([dhm])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60}


def period_s(text: str) -> int:
    """``7d``, ``12h``, ``30m`` in seconds; a :class:`UserError` naming ``--since`` else."""
    found = _PERIOD.fullmatch(text.strip())
    if found is None or int(found[1]) == 0:
        raise UserError(
            f"--since: {text!r:.40} is not a period; give a number and d, h or m (7d, 12h, 30m)"
        )
    return int(found[1]) * _UNIT_S[found[2]]


def since(runs: Sequence[Run], seconds: int, now: float) -> list[Run]:
    """The runs submitted in the last ``seconds`` before ``now``, oldest first; one whose
    record's time cannot be read is left out."""
    kept = []
    for run in runs:
        try:
            when = datetime.fromisoformat(run.submitted_at).timestamp()
        except (ValueError, OverflowError, OSError):
            continue
        if now - seconds <= when <= now + 60:
            kept.append(run)
    return sorted(kept, key=lambda r: (r.submitted_at, r.path.name))

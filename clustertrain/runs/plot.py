"""``clustertrain plot JOB``: one PNG of what the job did, from its events.

Top: the training ``loss`` and the job's headline metric (its ``metric``), each against the
global step and against wall time, every attempt on the same axes in its own colour, restarts
marked; a metric no event carries is left out. Bottom: a timeline with one lane
per attempt (start-up, training, training lost after the last checkpoint; checkpoints and
signals as marks) and the waits in the queue before and between attempts; the title gives the
goodput (:mod:`clustertrain.runs.timeline`) and, for a job that failed, its cause. matplotlib is
imported here only.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

from clustertrain.files import printable
from clustertrain.rank import events
from clustertrain.runs import Run, goodput, sweeps, tasks, timeline
from clustertrain.spec import sweep

Warn = Callable[[str], None] | None
# The training loss every plot draws when the events carry it (runtime.log_metrics(step, loss=..)).
LOSS = "loss"
# Events drawn as marks on their attempt's lane: a hang where it was declared, a restart of the
# step inside the allocation where it began.
MARKS = {
    events.CHECKPOINT: "kv",
    events.SIGNAL: "r*",
    events.REQUEUED: "b^",
    events.NODE_CHECK: "k|",
    events.HANG: "mX",
    events.NODE_LOST: "rX",
    events.STRAGGLER: "yD",
    events.RESTARTED: "m>",
}
# How many points of each curve a picture draws at most (a million steps: a line of pixels).
POINTS = 5000
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
PHASE_COLOURS = {
    "queued": "#d9d9d9",
    "start-up": "#fdd49e",
    "training": "#74c476",
    "lost": "#fb6a4a",
}


def draw(run: Run, out: Path, warn: Warn = None, cause: str | None = None) -> Path:
    """Write the picture of ``run`` (a job, or a sweep: every task) to ``out`` (PNG); ``warn``
    hears of event lines left out (:meth:`clustertrain.runs.Run.events`); a job that failed
    says why under its title (``cause``: the headline ``status`` prints)."""
    matplotlib.use("Agg")  # no screen needed
    import matplotlib.pyplot as plt  # lazy: start-up time (0.3 s), only plot needs it

    metrics = list(dict.fromkeys(m for m in (LOSS, run.metric) if m))
    fig = plt.figure(figsize=(13, 4.25 * len(metrics) + 2), constrained_layout=True)
    grid = fig.add_gridspec(len(metrics) + 1, 2, height_ratios=(*([1] * len(metrics)), 0.8))
    axes = {
        (metric, x): fig.add_subplot(grid[row, column])
        for row, metric in enumerate(metrics)
        for column, x in enumerate(("step", "time"))
    }
    draw_run = _sweep if tasks(run) else _job
    title = draw_run(fig, grid, axes, run, warn)
    for (metric, x), ax in axes.items():
        ax.set_xlabel("global step" if x == "step" else "wall time since queued (s)")
        ax.set_ylabel(printable(metric) + (" (headline)" if metric == run.metric else ""))
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8, loc="best")
    fig.suptitle(titled(title, cause), fontsize=13)
    # Written beside, then renamed over the name: a symlink planted at the name (a run folder
    # is anyone's to write) is replaced, never written through; the file beside is a new one
    # of a name nobody could guess (mkstemp: O_EXCL, 0600), never one planted there.
    fd, partial = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    mask = os.umask(0o077)
    os.umask(mask)
    try:
        os.fchmod(fd, 0o666 & ~mask)  # readable as any file savefig made, once whole
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, dpi=100, format="png")
        os.replace(partial, out)
    finally:
        Path(partial).unlink(missing_ok=True)
        plt.close(fig)
    return out


def titled(title: str, cause: str | None) -> str:
    """The picture's title: what the job did, and, for a job that failed, why on a line below
    (escaped, shortened to fit the width)."""
    if not cause:
        return title
    return f"{title}\n{textwrap.shorten(printable(cause), 160, placeholder=' ...')}"


def _job(fig: Any, grid: Any, axes: dict[tuple[str, str], Any], run: Run, warn: Warn) -> str:
    found = run.events(warn, POINTS)
    runs = timeline.attempts(found)
    origin = min((e.time for e in found), default=0.0)
    for attempt in runs:
        colour = COLOURS[attempt.number % len(COLOURS)]
        _curves(axes, attempt, origin, colour, f"attempt {attempt.number}")
    _lanes(fig.add_subplot(grid[-1, :]), found, runs, origin)
    good = goodput.goodput(found).share
    share = f"goodput {100 * good:.0f} %" if good is not None else "no attempt recorded"
    return (
        f"job {run.job_id} ({printable(run.name)}): {len(runs)} attempt(s), {share} "
        "(productive training / wall time, as `report` says)"
    )


def _sweep(fig: Any, grid: Any, axes: dict[tuple[str, str], Any], run: Run, warn: Warn) -> str:
    """Every task's curves, labelled with its parameters; a lane per task."""
    table = sweeps.read_table(run.path)
    views = tasks(run)
    found = {view.job_id: view.events(warn, POINTS) for view in views}
    origin = min((e.time for seen in found.values() for e in seen), default=0.0)
    lanes = fig.add_subplot(grid[-1, :])
    spent = [goodput.goodput(seen) for seen in found.values()]
    seen: set[str] = set()
    for k, view in enumerate(views):
        number = view.task_number or 0
        label = printable(f"task {number}: {sweep.describe(table.get(number, {}))}")[:60]
        colour = COLOURS[k % len(COLOURS)]
        attempts = timeline.attempts(found[view.job_id])
        phases = [w for _, w in timeline.waits(found[view.job_id], attempts)]
        for attempt in attempts:
            _curves(axes, attempt, origin, colour, label if attempt.number == 0 else None)
            phases += attempt.phases()
        for phase in phases:
            shown = phase.name not in seen
            seen.add(phase.name)
            lanes.barh(
                k, phase.seconds, left=phase.start - origin, height=0.6,
                color=PHASE_COLOURS[phase.name], edgecolor=colour, lw=1.5,
                label=phase.name if shown else None,
            )  # fmt: skip
    lanes.set_yticks(range(len(views)), [f"task {v.task_number}" for v in views])
    lanes.invert_yaxis()
    lanes.set_xlabel("wall time since queued (s)")
    lanes.set_title("tasks: each lane a task, its attempts and its waits in the queue", fontsize=11)
    lanes.set_xlim(left=0)
    if seen:
        lanes.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    wall = sum(g.wall_s or 0.0 for g in spent)
    share = f", goodput {100 * sum(g.productive_s for g in spent) / wall:.0f} %" if wall else ""
    return f"sweep {run.job_id} ({printable(run.name)}): {len(views)} tasks{share}"


def _curves(
    axes: dict[tuple[str, str], Any],
    attempt: timeline.Attempt,
    origin: float,
    colour: str,
    label: str | None,
) -> None:
    for metric in dict.fromkeys(metric for metric, _ in axes):
        points = timeline.series(list(attempt.events), metric)
        if not points:  # nothing to draw: no empty line in the legend either
            continue
        ys = [e.values[metric] for e in points]
        steps = [e.values.get("step", 0) for e in points]
        times = [e.time - origin for e in points]
        marker = "o" if len(points) < 20 else "." if len(points) < 100 else None
        axes[(metric, "step")].plot(steps, ys, color=colour, label=label, marker=marker)
        axes[(metric, "time")].plot(times, ys, color=colour, label=label, marker=marker)
        if attempt.number > 0:
            # A restart: where the attempt began, in time and in steps.
            axes[(metric, "time")].axvline(attempt.start - origin, color=colour, ls="--", lw=1)
            if steps:
                axes[(metric, "step")].axvline(steps[0], color=colour, ls="--", lw=1)


def _lanes(ax: Any, found: list[events.Event], runs: list[timeline.Attempt], origin: float) -> None:
    """One lane per attempt, the first at the top; the queue waits on the attempt they precede."""
    seen: set[str] = set()

    def bar(lane: int, phase: timeline.Phase) -> None:
        label = phase.name if phase.name not in seen else None
        seen.add(phase.name)
        ax.barh(
            lane, phase.seconds, left=phase.start - origin, height=0.6,
            color=PHASE_COLOURS[phase.name], edgecolor="#555555", lw=0.5, label=label,
        )  # fmt: skip

    for number, wait in timeline.waits(found, runs):
        bar(number, wait)
    for attempt in runs:
        for phase in attempt.phases():
            bar(attempt.number, phase)
        for event in attempt.events:
            if event.name in MARKS:
                label = event.name if event.name not in seen else None
                seen.add(event.name)
                ax.plot(event.time - origin, attempt.number, MARKS[event.name], ms=8, label=label)
        ax.text(attempt.end - origin, attempt.number, f"  {attempt.how}", va="center", fontsize=9)
    ax.set_yticks([a.number for a in runs], [f"attempt {a.number}" for a in runs])
    if runs:  # room on the right for the last attempt's "ended ..."
        ax.set_xlim(0, 1.1 * (max(a.end for a in runs) - origin))
    ax.invert_yaxis()
    ax.set_xlabel("wall time since queued (s)")
    ax.set_title("timeline", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    if seen:
        ax.legend(fontsize=8, ncol=8, loc="upper center", bbox_to_anchor=(0.5, -0.28))

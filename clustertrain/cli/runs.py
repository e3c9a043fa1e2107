"""``clustertrain status|list|plot|results``: what a submitted job or sweep did, from its run
folder and Slurm (and from the run folder alone while Slurm cannot be reached). Each command
parses, calls the library, prints."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from clustertrain.cli.options import runs_dir_option
from clustertrain.errors import UserError
from clustertrain.files import printable
from clustertrain.jobstate import RUN_FOLDER

if TYPE_CHECKING:
    from clustertrain.api import Job
    from clustertrain.jobstate import JobState


@click.command(
    epilog="\b\nExamples:\n  clustertrain status\n  clustertrain status 42\n"
    "  clustertrain status 42 --why\n  clustertrain status last --json"
)
@click.argument("job", default="last")
@click.option("--json", "as_json", is_flag=True, help="The state alone, as JSON, for scripts.")
@click.option(
    "--why",
    "why",
    is_flag=True,
    help="For a job that failed: the cause, then the evidence behind it (at most 20 lines).",
)
@runs_dir_option
def status(job: str, as_json: bool, why: bool, runs_dir: str | None) -> None:
    """State, nodes, elapsed time, restarts and the job's headline metric (its `metric`) of
    JOB; for a job that failed, why, in one line (--why: with its evidence)."""
    from clustertrain import runs
    from clustertrain.api import Job

    if as_json and why:
        raise UserError("--why: not with --json; for the cause as data, use Job.failure")
    attached = Job.attach(job, runs_dir)
    relayed(attached, "status", *(["--json"] if as_json else []), *(["--why"] if why else []))
    run = attached.run
    if as_json:
        click.echo(json.dumps(attached.job_state().as_dict()))
        return
    if runs.tasks(run):
        _sweep_status(attached)
        return
    report = attached.status(warn)  # what became of it, and why (clustertrain.runs.report)
    state = report.state
    _say(f"job {run.job_id} ({run.name}): {state.state}")
    if why:
        for line in report.why_lines() or ["no failure: nothing to explain"]:
            _say(f"  {line}")
        return
    _say(
        f"  nodes: {state.nodes or '-'}   elapsed: {state.elapsed or '-'}   "
        f"restarts: {state.restarts}"
    )
    if state.reason:
        _say(f"  reason: {state.reason}")
    _say(f"  run folder: {run.path}")
    for line in report.lines():
        _say(f"  {line}")


def _sweep_status(job: Job) -> None:
    """An array: its state with a count per state, then a line per task."""
    from clustertrain.runs import results

    run = job.run
    report = job.status(warn)
    state = report.state
    _say(f"sweep {run.job_id} ({run.name}): {state.state} ({state.counts()})")
    _say(f"  run folder: {run.path}")
    for line in report.source_lines():
        _say(f"  {line}")
    for row in sorted(results.rows(run, state, warn), key=lambda r: r.task):
        said = f", {row.metric} {row.value:.6g}" if row.value is not None else ""
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        _say(f"  task {row.task} ({params}): {row.state}{said}")
    click.echo(
        f"  one task: clustertrain status {run.job_id}_K; all: clustertrain results {run.job_id}"
    )


def _say(line: str) -> None:
    """A line of ``status``: what it says comes from run folders, Slurm and events, which
    anyone who can write there may craft; escaped once, here, whatever said it."""
    click.echo(printable(line))


@click.command(
    epilog="\b\nExamples:\n  clustertrain plot last\n  clustertrain plot 42 -o job42.png"
)
@click.argument("job", default="last")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="PNG file to write.")
@runs_dir_option
def plot(job: str, output: str | None, runs_dir: str | None) -> None:
    """Draw JOB's training curves and timeline (attempts, waits, goodput) as one PNG; a job
    that failed says why under the title."""
    from clustertrain import runs
    from clustertrain.api import Job

    try:
        from clustertrain.runs import plot as drawing
    except ImportError:
        raise UserError("plot needs matplotlib: pip install 'clustertrain[plot]'") from None
    attached = Job.attach(job, runs_dir)
    run = attached.run
    attached.backend.sync(run)  # a remote run's events and metrics, drawn here
    out = Path(output) if output else run.path / "plot.png"
    if out.suffix.lower() != ".png":
        raise UserError(f"output: {str(out)!r} is not a .png file; name one like job.png")
    cause = None if runs.tasks(run) else attached.status().cause  # draw warns of the events
    click.echo(f"wrote {drawing.draw(run, out, warn, cause.headline if cause else None)}")


@click.command(
    epilog="\b\nExamples:\n  clustertrain results 42\n  clustertrain results last --json"
)
@click.argument("job", default="last")
@click.option("--json", "as_json", is_flag=True, help="JSON, for scripts.")
@runs_dir_option
def results(job: str, as_json: bool, runs_dir: str | None) -> None:
    """One row per task of the sweep JOB: parameters, state, the headline metric (the job's
    `metric`), restarts; best first (by `metric_mode`)."""
    from clustertrain import runs
    from clustertrain.api import Job
    from clustertrain.runs import results as table

    attached = Job.attach(job, runs_dir)
    relayed(attached, "results", *(["--json"] if as_json else []))
    if not runs.tasks(attached.run):
        raise UserError(f"JOB: {attached.job_id} is not a sweep; see `clustertrain status`")
    found = table.rows(attached.run, attached.job_state(), warn)
    click.echo(table.as_json(found) if as_json else table.text(found))


@click.command(name="list", epilog="\b\nExample:\n  clustertrain list --limit 5")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@runs_dir_option
def list_jobs(limit: int, runs_dir: str | None) -> None:
    """Recent jobs from the run folders, newest first: state, nodes, elapsed time, headline
    metric, and for a job that failed, why (as `status` says it). A state marked * is its run
    folder's (Slurm not reachable, or a login node's job,
    which `status` asks)."""
    from clustertrain import runs
    from clustertrain.api import Job
    from clustertrain.runs import folderstate, report, timeline

    asker, marked = folderstate.Asker(), False
    for run in runs.all_runs(runs.runs_root(runs_dir), warn)[:limit]:
        backend = Job(run).backend
        host = backend.host()
        if host is None:
            state = asker.ask(run, backend.name, functools.partial(backend.state, run)).state
        else:  # a login node's: one ssh each; `status` asks it
            state = folderstate.folder_state(run, warn)
        mark = "*" if state.source == RUN_FOLDER else ""
        marked = marked or bool(mark)
        sweep = len(runs.tasks(run))
        found = [] if sweep else run.events(warn)
        headline = None if sweep else timeline.headline(found, run.metric)
        cause = None if sweep else report.cause(run, state, found)
        click.echo(
            f"{run.job_id:>8}  {printable(run.submitted_at)}  {printable(run.name):<16} "
            f"{run.nodes}x{run.world_size // max(run.nodes, 1)} {run.launcher:<10} "
            f"{state.state + mark:<11} {printable(state.nodes) or '-':<12} "
            f"{printable(state.elapsed) or '-':>10}  {headline.text() if headline else '-':<20} "
            f"{printable(str(run.path))}"
            + (f"  sweep of {sweep} tasks: {state.counts() or 'state unknown'}" if sweep else "")
            + (f"  on {host}" if host else "")
            + (f"  {_short(cause.headline)}" if cause else "")
        )
    for why in asker.down.values():
        say(f"Slurm not reachable ({why}): the states marked * are the run folders'")
    if marked and not asker.down:
        say("the states marked * are the run folders' (`status JOB` asks a login node)")


def ended(attached: Job, state: JobState, what: str = "job") -> None:
    """The end a follower saw, on stderr: ``job N ended STATE``, and for a job that did not
    complete why, in one line and its hint (exit 1), as ``status`` says it."""
    click.echo(f"clustertrain: {what} {attached.job_id} ended {state.state}", err=True)
    if state.state == "COMPLETED":
        return
    cause = attached.status(warn, state).cause
    for line in cause.lines() if cause else []:
        click.echo(f"clustertrain: {line}", err=True)
    raise SystemExit(1)


def _short(headline: str, width: int = 100) -> str:
    """A cause's headline in ``list``'s last column: its start, where it is long."""
    return headline if len(headline) <= width else headline[: width - 3] + "..."


def warn(message: str) -> None:
    click.echo(f"clustertrain: warning: {printable(message)}", err=True)


def say(message: str) -> None:
    """A note on stderr, beside the output (the scheduler lost and back, where a state came
    from), with the SLURM_CONF to export where Slurm found no configuration."""
    from clustertrain.api import slurm_conf_hint

    click.echo(f"clustertrain: {printable(slurm_conf_hint(message))}", err=True)


def relayed(attached: Job, command: str, *args: str, follow: bool = False) -> None:
    """A job whose backend answers through another clustertrain (a login node's, for a job
    submitted with --host) is answered there, as this command: exit with its status."""
    status = attached.relay(command, *args, follow=follow)
    if status is not None:
        raise SystemExit(status)

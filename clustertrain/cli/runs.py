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


@click.command(
    epilog="\b\nExamples:\n  clustertrain status\n  clustertrain status 42\n"
    "  clustertrain status last --json"
)
@click.argument("job", default="last")
@click.option("--json", "as_json", is_flag=True, help="The state alone, as JSON, for scripts.")
@runs_dir_option
def status(job: str, as_json: bool, runs_dir: str | None) -> None:
    """State, nodes, elapsed time, restarts and the job's headline metric (its `metric`) of
    JOB."""
    from clustertrain import runs
    from clustertrain.api import Job

    attached = Job.attach(job, runs_dir)
    relayed(attached, "status", *(["--json"] if as_json else []))
    run = attached.run
    if as_json:
        click.echo(json.dumps(attached.job_state().as_dict()))
        return
    if runs.tasks(run):
        _sweep_status(attached)
        return
    report = attached.status(_warn)  # what became of it, and why (clustertrain.runs.report)
    state = report.state
    _say(f"job {run.job_id} ({run.name}): {state.state}")
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
    report = job.status(_warn)
    state = report.state
    _say(f"sweep {run.job_id} ({run.name}): {state.state} ({state.counts()})")
    _say(f"  run folder: {run.path}")
    for line in report.source_lines():
        _say(f"  {line}")
    for row in sorted(results.rows(run, state, _warn), key=lambda r: r.task):
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
    """Draw JOB's training curves and timeline (attempts, waits, goodput) as one PNG."""

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
    click.echo(f"wrote {drawing.draw(run, out, _warn)}")


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
    found = table.rows(attached.run, attached.job_state(), _warn)
    click.echo(table.as_json(found) if as_json else table.text(found))


@click.command(name="list", epilog="\b\nExample:\n  clustertrain list --limit 5")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@runs_dir_option
def list_jobs(limit: int, runs_dir: str | None) -> None:
    """Recent jobs from the run folders, newest first: state, nodes, elapsed time and headline
    metric. A state marked * is its run folder's (Slurm not reachable, or a login node's job,
    which `status` asks)."""
    from clustertrain import runs
    from clustertrain.api import Job
    from clustertrain.runs import folderstate, timeline

    asker, marked = folderstate.Asker(), False
    for run in runs.all_runs(runs.runs_root(runs_dir), _warn)[:limit]:
        backend = Job(run).backend
        host = backend.host()
        if host is None:
            state = asker.ask(run, backend.name, functools.partial(backend.state, run)).state
        else:  # a login node's: one ssh each; `status` asks it
            state = folderstate.folder_state(run, _warn)
        mark = "*" if state.source == RUN_FOLDER else ""
        marked = marked or bool(mark)
        sweep = len(runs.tasks(run))
        headline = None if sweep else timeline.headline(run.events(_warn), run.metric)
        click.echo(
            f"{run.job_id:>8}  {printable(run.submitted_at)}  {printable(run.name):<16} "
            f"{run.nodes}x{run.world_size // max(run.nodes, 1)} {run.launcher:<10} "
            f"{state.state + mark:<11} {printable(state.nodes) or '-':<12} "
            f"{printable(state.elapsed) or '-':>10}  {headline.text() if headline else '-':<20} "
            f"{printable(str(run.path))}"
            + (f"  sweep of {sweep} tasks: {state.counts() or 'state unknown'}" if sweep else "")
            + (f"  on {host}" if host else "")
        )
    for why in asker.down.values():
        say(f"Slurm not reachable ({why}): the states marked * are the run folders'")
    if marked and not asker.down:
        say("the states marked * are the run folders' (`status JOB` asks a login node)")


def _warn(message: str) -> None:
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

"""``clustertrain track``: a job's records relayed to TensorBoard, MLflow or W&B (see
:mod:`clustertrain.track`). It parses, calls ``Job.track``, prints."""

from __future__ import annotations

import click

from clustertrain.cli.options import runs_dir_option
from clustertrain.files import printable
from clustertrain.spec.fields import TRACKERS


@click.command(
    epilog="\b\nExamples:\n  clustertrain track last --to tensorboard\n"
    "  clustertrain track 42 --to mlflow --uri http://127.0.0.1:5000 --follow\n"
    "  clustertrain track 42 --to wandb"
)
@click.argument("job", default="last")
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Choice(TRACKERS),
    help="The tracker.",
)
@click.option("--follow", is_flag=True, help="Keep relaying, live, until the job ends.")
@click.option(
    "--uri",
    metavar="URI",
    help="MLflow's tracking URI (default: $MLFLOW_TRACKING_URI); W&B's server for wandb sync.",
)
@click.option(
    "--logdir",
    metavar="DIR",
    help="TensorBoard's log folder (default: the run folder's tensorboard/).",
)
@runs_dir_option
def track(
    job: str, to: str, follow: bool, uri: str | None, logdir: str | None, runs_dir: str | None
) -> None:
    """Send JOB's params, metrics (every log_metrics value at its step), tags, restarts and, once
    it ended, its plot and job file to a tracker, from this machine: the job's nodes need no
    route out. What was sent is kept in the run folder (track/), so a relay run again sends
    only what is new."""
    from clustertrain.api import Job

    attached = Job.attach(job, runs_dir)
    summary = attached.track(to, follow=follow, uri=uri, logdir=logdir, say=_say)
    if to == "wandb":  # W&B gets the script's own offline runs, synced once the job ended
        _say(
            f"wandb: the job ended {summary.state}; its offline runs are synced (said above)"
            if summary.state
            else "wandb: the job has not ended yet; its offline runs are synced once it has"
        )
        return
    ended = f"; ended {summary.state}, sent {len(summary.files)} file(s)" if summary.state else ""
    skipped = f"; {summary.skipped} record(s) skipped in all" if summary.skipped else ""
    _say(f"{to}: {summary.sent} point(s) sent{skipped}{ended}")


def _say(line: str) -> None:
    click.echo(printable(line))

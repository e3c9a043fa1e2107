"""``clustertrain report``: what a job, a sweep or a period's jobs cost, and their goodput
(:mod:`clustertrain.runs.cost`). It parses, calls the library, prints."""

from __future__ import annotations

import click

from clustertrain.cli.options import runs_dir_option
from clustertrain.cli.runs import warn
from clustertrain.errors import UserError


@click.command(
    epilog="\b\nExamples:\n  clustertrain report\n  clustertrain report 42\n"
    "  clustertrain report --since 7d\n  clustertrain report --since 30d --format csv > cost.csv"
)
@click.argument("job", required=False)
@click.option(
    "--since", metavar="PERIOD",
    help="Every job submitted within PERIOD (7d, 12h, 30m) under the runs root, and the total.",
)  # fmt: skip
@click.option(
    "--format", "form", type=click.Choice(["text", "csv", "json"]), default="text",
    show_default=True, help="csv, json: a row per job (a sweep's: per task), for pandas.",
)  # fmt: skip
@runs_dir_option
def report(job: str | None, since: str | None, form: str, runs_dir: str | None) -> None:
    """What JOB (default: the last) cost and its goodput: queue wait, wall time, node- and
    GPU-hours (Slurm's accounting where kept, else the run folder's), and where its time went
    (start-up, node check, checkpoints, restarts, lost progress, requeue waits). A sweep: a row
    per task and the total."""
    from clustertrain import api
    from clustertrain.runs import cost, cost_text

    if job is not None and since is not None:
        raise UserError("JOB: give a job or --since PERIOD, not both")
    if since is not None:
        found = api.costs_since(since, runs_dir, warn)
        costs = [part for c in found for part in (c.parts or (c,))]
        whole = cost.total("", f"since {since}", found)
    else:
        whole = api.Job.attach(job or "last", runs_dir).cost(warn)
        costs = list(whole.parts or (whole,))
    if form == "csv":
        click.echo(cost_text.as_csv(costs), nl=False)
    elif form == "json":
        click.echo(cost_text.as_json(costs))
    elif since is not None and not found:
        click.echo(f"no jobs submitted in the last {since}")
    elif since is not None:
        click.echo("\n".join(cost_text.table(whole, f"jobs submitted in the last {since}")))
    elif whole.parts:
        click.echo("\n".join(cost_text.table(whole, f"sweep {whole.job_id} ({whole.name})")))
    else:
        click.echo("\n".join(cost_text.lines(whole)))

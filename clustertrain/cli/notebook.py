"""``clustertrain notebook-submit``: what a login node's clustertrain runs for a notebook
elsewhere (``notebook_launcher(..., host=...)``, which sends the command line and the call): the
call arrives on stdin and is queued as ``notebook_launcher`` queues one here. Not for users to
type, so hidden from ``--help``; its fields are checked as ``submit``'s are."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from clustertrain.cli.options import prepare_option, runs_dir_option, spec_fields, spec_options
from clustertrain.errors import UserError

if TYPE_CHECKING:
    from clustertrain.api import Job


@click.command(name="notebook-submit", hidden=True)
@spec_options
@prepare_option
@runs_dir_option
@click.option(
    "--max-bytes", type=click.IntRange(min=1), required=True, help="The call's size limit."
)
@click.option("--no-preflight", is_flag=True, help="Queue even what the limits refuse.")
@click.pass_context
def notebook_submit(
    ctx: click.Context,
    runs_dir: str | None,
    max_bytes: int,
    no_preflight: bool,
    replace_args: bool,
    skip_prepare: bool,
    **flags: Any,
) -> None:
    """Queue the notebook's call that stdin holds (pickled by clustertrain.notebook.pack)."""
    from clustertrain import notebook

    if spec_fields(ctx, replace_args, flags) or flags.pop("args") is not None:
        raise UserError("args: a notebook's call takes its arguments in the call; leave them out")
    call = sys.stdin.buffer.read(max_bytes + 1)
    if not 0 < len(call) <= max_bytes:
        raise UserError(f"stdin: {len(call)} bytes, not a call of 1 to {max_bytes} bytes")
    job = notebook.queue(
        call, max_bytes, "slurm", not no_preflight, runs_dir, skip_prepare=skip_prepare, **flags
    )
    echo_queued(job)


def echo_queued(job: Job) -> None:
    """What ``submit`` says of a job it queued; the lines a remote submission reads back."""
    run = job.run
    click.echo(
        f"submitted job {run.job_id}: {run.nodes} node(s) x {run.world_size // run.nodes} "
        f"process(es), {run.launcher}"
    )
    click.echo(f"run folder: {job.run_dir}")
    click.echo(f"follow it:  clustertrain logs {job.job_id} --follow")

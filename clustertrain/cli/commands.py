"""The ``clustertrain`` command line: each command parses, calls the library, prints.

Errors a user can fix arrive as :class:`UserError` and leave as one line on stderr with exit
status 2. Heavy modules (submitit, torch) are imported only by the commands that need them, so
``--help`` and ``submit --dry-run`` stay fast.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from clustertrain.cli import inside as cli_inside
from clustertrain.cli import runs as cli_runs
from clustertrain.cli.cluster import cluster
from clustertrain.cli.notebook import echo_queued, notebook_submit
from clustertrain.cli.options import (
    DashCommand,
    host_option,
    prepare_option,
    remote_clustertrain_option,
    remote_options,
    runs_dir_option,
    spec_fields,
    spec_options,
)
from clustertrain.cli.report import report
from clustertrain.cli.track import track
from clustertrain.errors import UserError
from clustertrain.version import __version__

_EPILOG_SUBMIT = """\b
Examples:
  clustertrain submit --nodes 4 --gpus-per-node 8 --dry-run
  clustertrain submit jobs/mnist.yaml --nodes 2 -- --epochs 3
  clustertrain submit --script train.py --prepare 'python fetch_data.py' --offline
  clustertrain submit jobs/mnist-accelerate.yaml --partition gpu --env NCCL_DEBUG=INFO
"""


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  clustertrain cluster up --nodes 4          # a local Slurm cluster on this machine (root)
  clustertrain submit jobs/mnist.yaml --nodes 2 --gpus-per-node 2
  clustertrain logs last --follow
""",
)
@click.version_option(__version__, prog_name="clustertrain")
def cli() -> None:
    """Run a PyTorch training script on many Slurm nodes: torchrun or accelerate, one command."""


@cli.command(cls=DashCommand, epilog=_EPILOG_SUBMIT)
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@spec_options
@prepare_option
@runs_dir_option
@remote_options
@click.option(
    "--dry-run", is_flag=True, help="Print what would be run and submitted; touch nothing."
)
@click.option(
    "--no-preflight",
    is_flag=True,
    help="Queue even a request the partition's limits say can never run.",
)
@click.pass_context
def submit(
    ctx: click.Context,
    job_file: str | None,
    runs_dir: str | None,
    dry_run: bool,
    no_preflight: bool,
    replace_args: bool,
    skip_prepare: bool,
    host: str | None,
    allow_dirty: bool,
    remote_clustertrain: str | None,
    **flags: Any,
) -> None:
    """Render a multi-node job and queue it; args after -- go to the training script.

    The job's prepare commands run here first (they fetch what the nodes cannot); with --host,
    on that login node, in a snapshot of this git tree."""
    from clustertrain import api

    extra = spec_fields(ctx, replace_args, flags)
    if host:
        # Checked here first, then said again to the login node as flags (spec.flags).
        far = api.submit(
            job_file, dry_run=dry_run, preflight=not no_preflight, extra_args=extra,
            runs_dir=runs_dir, host=host, allow_dirty=allow_dirty,
            remote_clustertrain=remote_clustertrain, skip_prepare=skip_prepare, **flags,
        )  # fmt: skip
        if isinstance(far, api.Job):
            click.echo(f"here: {far.run_dir} (status, logs and cancel ask {host})")
        return
    if dry_run:
        job = api.plan(
            job_file, extra_args=extra, runs_dir=runs_dir, skip_prepare=skip_prepare, **flags
        )
        click.echo(job.dry_run_text(), nl=False)
        return
    submitted = api.submit(
        job_file,
        preflight=not no_preflight,
        extra_args=extra,
        runs_dir=runs_dir,
        skip_prepare=skip_prepare,
        **flags,
    )
    assert isinstance(submitted, api.Job)
    echo_queued(submitted)


@cli.command(
    cls=DashCommand,
    epilog="\b\nExamples:\n  clustertrain run jobs/mnist.yaml --nodes 2 -- --epochs 1\n"
    "  clustertrain run --script train.py --procs-per-node 2 --dry-run",
)
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@spec_options
@prepare_option
@runs_dir_option
@click.option("--dry-run", is_flag=True, help="Print the commands it would run; touch nothing.")
@click.option(
    "--no-preflight", is_flag=True, help="Start even a module this host's Python cannot find."
)
@click.pass_context
def run(
    ctx: click.Context,
    job_file: str | None,
    runs_dir: str | None,
    dry_run: bool,
    no_preflight: bool,
    replace_args: bool,
    skip_prepare: bool,
    **flags: Any,
) -> None:
    """Run the job here, without Slurm, and follow it: nodes x processes ranks on this machine.

    The run folder is laid out as a Slurm job's, so status, logs and list work on it."""

    from clustertrain import api
    from clustertrain.render import launcher_argv, prepare_text

    extra = spec_fields(ctx, replace_args, flags)
    if dry_run:
        planned = api.plan(
            job_file, extra_args=extra, runs_dir=runs_dir, skip_prepare=skip_prepare, **flags
        )
        click.echo(prepare_text(planned.spec, planned.workdir), nl=False)
        words = [shlex.quote(word) for word in launcher_argv(planned.spec, standalone_port=0)]
        click.echo("".join(f" \\\n    {w}" if w.startswith("-") else f" {w}" for w in words)[1:])
        return
    job = api.run_local(
        job_file,
        extra_args=extra,
        runs_dir=runs_dir,
        preflight=not no_preflight,
        skip_prepare=skip_prepare,
        **flags,
    )
    run = job.run
    click.echo(f"local run {run.job_id}: {run.world_size} process(es) here, {run.launcher}")
    click.echo(f"run folder: {job.run_dir}")
    try:
        from clustertrain.runs import logs as joblogs

        state = joblogs.follow(run, joblogs.Filter(), job.job_state, sys.stdout)
    except KeyboardInterrupt:  # the whole foreground group got it; the supervisor records it
        job.wait(timeout=60)
        state = job.job_state()
    cli_runs.ended(job, state, "local run")


@cli.command(epilog="\b\nExample:\n  clustertrain cancel 42")
@click.argument("job")
@runs_dir_option
def cancel(job: str, runs_dir: str | None) -> None:
    """Cancel JOB (a job id, a run folder or 'last')."""
    from clustertrain.api import Job

    attached = Job.attach(job, runs_dir)
    cli_runs.relayed(attached, "cancel")
    attached.cancel()
    click.echo(f"cancelled job {attached.job_id}")


@cli.command(
    epilog="\b\nExamples:\n  clustertrain logs last --follow\n"
    "  clustertrain logs 42 --rank 3\n  clustertrain logs 42 --errors\n  clustertrain logs 42 --raw"
)
@click.argument("job", default="last")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Stream new lines until the job ends; exit 0 only if it COMPLETED. Watches the logs "
    "with inotify on a local filesystem, polls them on a shared one (NFS, Lustre); "
    "$CLUSTERTRAIN_FOLLOW=poll|inotify|auto chooses.",
)
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank.")
@click.option("--node", help="Only this node.")
@click.option("--errors", is_flag=True, help="Only stderr, progress bars left out.")
@click.option(
    "--raw",
    is_flag=True,
    help="Every line as written: what follows a failure (launchers' failure reports, c10d "
    "stack frames, peers' lost-connection tracebacks) is not folded, and a progress bar shows "
    "every update.",
)
@runs_dir_option
def logs(
    job: str,
    follow: bool,
    rank: int | None,
    node: str | None,
    errors: bool,
    raw: bool,
    runs_dir: str | None,
) -> None:
    """Every rank's output, each line prefixed with its node and rank. A progress bar shows
    once, at its last state (with --follow on a terminal, a live line per rank). After a rank
    fails, the consequences in other ranks and launchers are folded to one line per run (--raw
    shows them)."""
    from clustertrain.api import Job
    from clustertrain.runs import logs as joblogs

    attached = Job.attach(job, runs_dir)
    run = attached.run
    filters = joblogs.Filter(rank=rank, node=node, errors=errors, raw=raw)
    cli_runs.relayed(attached, "logs", *filters.words(), follow=follow)
    if not follow:
        cause = attached.status(cli_runs.warn).cause if errors else None
        for line in cause.lines() if cause else []:  # why it failed, as `status` says it
            click.echo(line)
        for line in joblogs.read_all(run, filters):
            click.echo(line)
        return
    # The backend's own answer, which raises while Slurm cannot be reached: the follower then
    # reads the run folder and asks again (clustertrain.runs.folderstate.Watch).
    with attached.relaying(say=cli_runs.say):  # the job file's `track`, relayed meanwhile
        state = joblogs.follow(
            run, filters, lambda: attached.backend.state(run), sys.stdout, say=cli_runs.say
        )
    cli_runs.ended(attached, state)


@cli.command(epilog="\b\nExamples:\n  clustertrain doctor\n  clustertrain doctor --host login")
@runs_dir_option
@host_option
@remote_clustertrain_option
def doctor(runs_dir: str | None, host: str | None, remote_clustertrain: str | None) -> None:
    """What the cluster offers, and whether this host has what jobs need (exit 1 if not); with
    --host, what that login node says, after ssh and its clustertrain's version."""
    from clustertrain import api, runs
    from clustertrain.backends.slurm import doctor as checks

    if host:
        from clustertrain.backends.remote.doctor import doctor as far_doctor
        from clustertrain.settings import hosts

        clustertrain = hosts.clustertrain_for(host, remote_clustertrain)
        raise SystemExit(far_doctor(host, clustertrain, click.echo))

    lines, problems = checks.report(api.slurm(), runs.runs_root(runs_dir))
    for line in lines:
        click.echo(line)
    click.echo("submission host: " + ("ready" if not problems else f"{len(problems)} problem(s)"))
    for problem in problems:
        click.echo(f"  - {problem}")
    if problems:
        raise SystemExit(1)


@cli.group(
    invoke_without_command=True,
    epilog="\b\nExamples:\n  clustertrain nodes\n  clustertrain nodes clear node3",
)
@runs_dir_option
@click.pass_context
def nodes(ctx: click.Context, runs_dir: str | None) -> None:
    """Your node record for this cluster: the nodes qualification flagged or your jobs lost,
    each with why and until when; submissions exclude them (avoid_bad_nodes)."""
    from clustertrain import api

    ctx.obj = runs_dir
    if ctx.invoked_subcommand is not None:
        return
    lines = api.remember_bad_nodes(runs_dir)
    for line in lines:
        click.echo(line)
    if not lines:
        click.echo("no node in your record: submissions exclude none")


@nodes.command(name="clear")
@click.argument("node", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every node of the record.")
@runs_dir_option
@click.pass_obj
def clear_nodes(
    group_runs_dir: str | None, node: tuple[str, ...], every: bool, runs_dir: str | None
) -> None:
    """Take NODE out of your record (what happened to it before now is not taken again)."""
    from clustertrain import api

    runs_dir = runs_dir or group_runs_dir
    if bool(node) == every:
        raise UserError("NODE: name the nodes to clear, or give --all")
    cleared = api.forget_bad_nodes(node, runs_dir, every=every)
    click.echo(f"cleared: {' '.join(cleared) or 'none (not in the record)'}")


for command in (
    cluster,
    cli_inside.attach,
    cli_inside.stacks,
    cli_inside.top,
    cli_runs.status,
    cli_runs.list_jobs,
    cli_runs.plot,
    cli_runs.results,
    report,
    track,
    notebook_submit,
):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="clustertrain", standalone_mode=False)
    except UserError as exc:
        from clustertrain.api import slurm_conf_hint  # lazy: start-up time, errors only

        _fail(slurm_conf_hint(str(exc)), 2)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, status: int) -> None:
    print(f"clustertrain: error: {'; '.join(message.splitlines())}", file=sys.stderr)
    sys.exit(status)

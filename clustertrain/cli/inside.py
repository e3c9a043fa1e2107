"""``clustertrain attach|stacks|top``: a look inside a running job, through its backend's
``node_command`` (clustertrain.backends.inside). Each command parses, calls the library, prints;
a job submitted with --host is answered by its login node's clustertrain."""

from __future__ import annotations

import json
import sys
import time

import click

from clustertrain.cli.options import AFTER_DASHES, DashCommand, runs_dir_option
from clustertrain.cli.runs import relayed

REFRESH_S = 2.0  # top's refresh, as top(1)'s default is near


@click.command(
    cls=DashCommand,
    epilog="\b\nExamples:\n  clustertrain attach 42                 # a shell on its first node\n"
    "  clustertrain attach 42 --node node2\n  clustertrain attach 42 -- nvidia-smi\n"
    "  clustertrain attach 42 -- bash -c 'ls $CLUSTERTRAIN_OUT_DIR'",
)
@click.argument("job")
@click.option("--node", metavar="NODE", help="One of the job's nodes (default: its first).")
@runs_dir_option
@click.pass_context
def attach(ctx: click.Context, job: str, node: str | None, runs_dir: str | None) -> None:
    """A shell inside JOB's allocation on NODE, beside its ranks (an overlapping step), in the
    job's environment: its variables, virtual environment and working directory. After `--`, a
    command instead, run as written (no shell unless you name one). `exit` leaves the job
    running."""
    import subprocess

    from clustertrain.api import Job
    from clustertrain.backends import inside

    attached = Job.attach(job, runs_dir)
    command = ctx.meta.get(AFTER_DASHES, ())
    relayed(
        attached,
        "attach",
        *(["--node", node] if node else []),
        *(["--", *command] if command else []),
    )
    argv = inside.attach_command(
        attached.backend, attached.run, node, command, pty=sys.stdin.isatty()
    )
    raise SystemExit(subprocess.run(argv, check=False).returncode)


@click.command(epilog="\b\nExamples:\n  clustertrain stacks 42\n  clustertrain stacks last --json")
@click.argument("job", default="last")
@click.option("--json", "as_json", is_flag=True, help="The groups as JSON, for tools.")
@runs_dir_option
def stacks(job: str, as_json: bool, runs_dir: str | None) -> None:
    """Every rank's Python stack now, without stopping JOB: ranks that stand in the same frames
    shown once, the odd ones out first, your own frames marked with '>'."""
    from clustertrain.api import Job

    attached = Job.attach(job, runs_dir)
    relayed(attached, "stacks", *(["--json"] if as_json else []))
    taken = attached.stacks()
    click.echo(json.dumps(taken.as_dict()) if as_json else "\n".join(taken.lines()))


@click.command(epilog="\b\nExamples:\n  clustertrain top 42\n  clustertrain top last --once")
@click.argument("job", default="last")
@click.option("--once", is_flag=True, help="One reading, then exit (for scripts).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the reading as JSON.")
@runs_dir_option
def top(job: str, once: bool, as_json: bool, runs_dir: str | None) -> None:
    """JOB's nodes (CPU %, memory, GPUs where nvidia-smi is, the straggler score) and ranks
    (last step, seconds a step, samples/s, CPU %, memory), every 2 s until Ctrl-C."""
    from clustertrain.api import Job
    from clustertrain.backends import inside

    attached = Job.attach(job, runs_dir)
    relayed(attached, "top", *(["--once"] if once else []), *(["--json"] if as_json else []))
    view, beats = inside.top(attached.backend, attached.run)
    try:
        while True:
            if as_json:
                click.echo(json.dumps(view.as_dict()))
            else:  # the screen cleared first, as top(1) redraws it
                click.echo(("" if once else "\033[H\033[2J") + "\n".join(view.lines()))
            if once:
                return
            time.sleep(REFRESH_S)
            view, beats = inside.top(attached.backend, attached.run, beats)
    except KeyboardInterrupt:  # Ctrl-C is how top ends: not an error
        return

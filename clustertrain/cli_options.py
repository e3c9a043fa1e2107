"""Options shared by the command modules (clustertrain.cli, clustertrain.cli_runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from clustertrain.errors import FieldError


def runs_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--runs-dir",
        metavar="DIR",
        help="Root of the run folders (default: $CLUSTERTRAIN_RUNS_DIR, else ./runs). "
        "It must be on a filesystem every node sees.",
    )(func)


# The spec's flags, shared by `submit` and `run`: every field of a job file has one.
SPEC_OPTIONS = [
    click.option("--nodes", type=int, help="Nodes to allocate (one launcher per node)."),
    click.option("--gpus-per-node", type=int, help="GPUs per node; one process per GPU."),
    click.option(
        "--procs-per-node",
        type=int,
        help="Processes per node when it differs from the GPUs (CPU-only nodes).",
    ),
    click.option(
        "--gres/--no-gres",
        "gpus_as_gres",
        default=None,
        help="Ask for GPUs as --gres=gpu:N (sites without --gpus-per-node).",
    ),
    click.option("--cpus-per-task", type=int, help="CPUs for each node's launcher task."),
    click.option("--time", help="Time limit, e.g. 01:30:00 or 2-00:00:00."),
    click.option("--name", help="Slurm job name."),
    click.option("--launcher", help="torchrun (default) or accelerate."),
    click.option("--script", help="Training script every process runs, e.g. train.py."),
    click.option(
        "--module",
        help="Python module every process runs as `python -m` (default jobs.mnist.train).",
    ),
    click.option(
        "--prepare",
        "prepare",
        multiple=True,
        metavar="'CMD ARG...'",
        help="A command run here, in this directory, before queueing (split like a shell "
        "line, never run by one; repeatable; replaces the job file's).",
    ),
    click.option(
        "--offline/--no-offline",
        default=None,
        help="Keep Hugging Face and W&B off the network inside the job (HF_HUB_OFFLINE=1...).",
    ),
    click.option("--partition"),
    click.option("--account"),
    click.option("--qos"),
    click.option("--constraint"),
    click.option("--exclusive/--no-exclusive", default=None, help="Whole nodes for this job."),
    click.option("--mem", help="Memory per node, e.g. 64G."),
    click.option("--mail-type"),
    click.option("--mail-user"),
    click.option("--dependency", help="e.g. afterok:1234"),
    click.option(
        "--sbatch-option",
        "sbatch_options",
        multiple=True,
        metavar="--OPT=VALUE",
        help="Any other sbatch option, passed through (repeatable).",
    ),
    click.option(
        "--env",
        "env",
        multiple=True,
        metavar="KEY=VALUE",
        help="Environment variable for the job (repeatable).",
    ),
    click.option(
        "--sweep",
        "sweep",
        multiple=True,
        metavar="NAME=V1,V2",
        help="A job array: each task passes --NAME V; the tasks are the product (repeatable).",
    ),
    click.option("--max-parallel", type=int, help="Tasks of a sweep that may run at once (%%P)."),
    click.option(
        "--signal-lead",
        "signal_lead_s",
        type=int,
        help="Seconds before the time limit at which the job is warned (USR2).",
    ),
    click.option("--max-restarts", type=int, help="Worker restarts the launcher may do."),
    click.option("--max-requeues", type=int, help="Requeues after a checkpoint (default 3)."),
    click.option(
        "--requeue-on-node-failure/--no-requeue-on-node-failure",
        default=None,
        help="A node lost mid-job: requeue without it and resume (default: end the job).",
    ),
    click.option(
        "--rdzv-timeout",
        "rdzv_timeout_s",
        type=int,
        help="Seconds the rendezvous and the first all-reduce may take (default 120).",
    ),
    click.option(
        "--socket-ifname",
        help="Interface(s) for gloo and NCCL, e.g. ib0 (default: each node's route to the head).",
    ),
    click.option(
        "--node-check/--no-node-check",
        default=None,
        help="Check every node's view of the head node before training (default on).",
    ),
    click.option(
        "--replace-args",
        is_flag=True,
        help="Arguments after -- replace the job file's args instead of following them.",
    ),
    click.option("--venv", help="Virtual environment the nodes use (default: the current one)."),
    click.option(
        "--container-image",
        help="Image the launcher and its ranks run in (pyxis: a name or .sqsh; apptainer: a "
        ".sif; oci: a root filesystem folder).",
    ),
    click.option("--container-runtime", help="pyxis, apptainer or oci (Slurm's srun --container)."),
    click.option(
        "--container-mount",
        "container_mounts",
        multiple=True,
        metavar="SRC[:DST[:ro]]",
        help="Another folder to mount in the container (repeatable; the run folder and the "
        "working directory always are).",
    ),
    click.option(
        "--container-env",
        "container_env",
        multiple=True,
        metavar="KEY=VALUE",
        help="Environment variable set inside the container only (repeatable).",
    ),
]


def spec_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(SPEC_OPTIONS):
        func = option(func)
    return func


def spec_fields(ctx: click.Context, replace_args: bool, flags: dict[str, Any]) -> list[str]:
    """Flags as spec fields (in place); returns the args that follow the job file's."""
    train_args = list(ctx.meta.get("train_args", ()))
    flags["args"] = train_args if replace_args else None
    flags["prepare"] = [_words(command) for command in flags["prepare"]] or None
    flags["env"] = list(flags["env"]) or None
    flags["sbatch_options"] = list(flags["sbatch_options"]) or None
    flags["sweep"] = list(flags["sweep"]) or None
    flags["container_mounts"] = list(flags["container_mounts"]) or None
    flags["container_env"] = list(flags["container_env"]) or None
    return [] if replace_args else train_args


def _words(command: str) -> list[str]:
    """A --prepare value as words, split as a shell would split it; nothing runs it in one."""
    import shlex

    try:
        return shlex.split(command)
    except ValueError as exc:
        raise FieldError("prepare", command, f"cannot be split into words ({exc})") from None


def prepare_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--no-prepare",
        "skip_prepare",
        is_flag=True,
        help="Skip the job's prepare commands (the data is already where the job reads it).",
    )(func)

"""Options shared by the command modules (clustertrain.cli, clustertrain.cli.runs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from clustertrain.spec import JobSpec
from clustertrain.spec.flags import flag_name, is_switch
from clustertrain.spec.jobfile import Plain

# Where a command that takes words after ``--`` keeps them (ctx.meta): the training script's
# arguments for submit and run, the command for attach.
AFTER_DASHES = "after_dashes"


class DashCommand(click.Command):
    """A command that keeps everything after ``--`` untouched by option parsing, in
    ``ctx.meta[AFTER_DASHES]``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[AFTER_DASHES] = tuple(args[cut + 1 :])
            args = args[:cut]
        return super().parse_args(ctx, args)


def runs_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--runs-dir",
        metavar="DIR",
        help="Root of the run folders (default: $CLUSTERTRAIN_RUNS_DIR, else ./runs). "
        "It must be on a filesystem every node sees.",
    )(func)


def default_text(field: dataclasses.Field[Any]) -> str | None:
    """The field's default as --help and the docs' field reference say it; None: no default."""
    shown = field.metadata["default_text"]
    if shown is None and is_switch(field):
        shown = "on" if field.default else "off"
    elif shown is None and field.default is not None and field.default != ():
        shown = str(field.default)
    return shown


def _help(field: dataclasses.Field[Any]) -> str:
    """The field's help and its default, said by the field itself (never retyped here)."""
    shown = default_text(field)
    return field.metadata["help"] + (f" (default: {shown})" if shown is not None else "")


def _spec_option(field: dataclasses.Field[Any]) -> Callable[..., Any]:
    """The flag of one spec field, built from its declaration (clustertrain.spec._field)."""
    flag, help_text, metavar = flag_name(field), _help(field), field.metadata["metavar"]
    if is_switch(field):
        return click.option(f"{flag}/--no-{flag[2:]}", field.name, default=None, help=help_text)
    if isinstance(field.default, tuple):
        return click.option(flag, field.name, multiple=True, metavar=metavar, help=help_text)
    if _is_int(field):  # read by the field's own check, as a job file's unquoted number is
        return click.option(flag, field.name, metavar=metavar or "N", help=help_text)
    return click.option(flag, field.name, metavar=metavar, help=help_text)


def _is_int(field: dataclasses.Field[Any]) -> bool:
    return str(field.type).startswith("int")


# The spec's flags, shared by `submit` and `run`: every field of a job file has one but `args`
# (what follows --), in the spec's order.
SPEC_FLAGS = [f for f in dataclasses.fields(JobSpec) if f.metadata["flag"] is not None]
SPEC_OPTIONS = [_spec_option(f) for f in SPEC_FLAGS] + [
    click.option(
        "--replace-args",
        is_flag=True,
        help="Arguments after -- replace the job file's args instead of following them.",
    )
]


def spec_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(SPEC_OPTIONS):
        func = option(func)
    return func


def spec_fields(ctx: click.Context, replace_args: bool, flags: dict[str, Any]) -> list[str]:
    """Flags as spec fields (in place); returns the args that follow the job file's.

    A repeatable flag not given is None (the job file's value stands), like any other."""
    train_args = list(ctx.meta.get(AFTER_DASHES, ()))
    flags["args"] = train_args if replace_args else None
    for field in SPEC_FLAGS:
        if _is_int(field) and flags[field.name] is not None:
            flags[field.name] = Plain(flags[field.name])
        if isinstance(field.default, tuple):
            convert = field.metadata["from_flag"] or (lambda value: value)
            flags[field.name] = [convert(value) for value in flags[field.name]] or None
    return [] if replace_args else train_args


def prepare_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--no-prepare",
        "skip_prepare",
        is_flag=True,
        help="Skip the job's prepare commands (the data is already where the job reads it).",
    )(func)


def host_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--host",
        envvar="CLUSTERTRAIN_HOST",
        metavar="HOST",
        help="A login node over ssh (a destination of your ~/.ssh/config); $CLUSTERTRAIN_HOST too.",
    )(func)


def remote_clustertrain_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--remote-clustertrain",
        metavar="PATH",
        help="With --host: the clustertrain to run on the login node (else "
        "$CLUSTERTRAIN_REMOTE_CLUSTERTRAIN, your hosts file's, or clustertrain on its PATH).",
    )(func)


def remote_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """submit's: where, what code, which clustertrain there."""
    func = click.option(
        "--allow-dirty",
        is_flag=True,
        help="With --host: send uncommitted changes as they are (never ignored files).",
    )(func)
    return host_option(remote_clustertrain_option(func))

"""Options shared by the command modules (clustertrain.cli, clustertrain.cli_runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def runs_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--runs-dir",
        metavar="DIR",
        help="Root of the run folders (default: $CLUSTERTRAIN_RUNS_DIR, else ./runs). "
        "It must be on a filesystem every node sees.",
    )(func)

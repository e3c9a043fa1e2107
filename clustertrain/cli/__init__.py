"""The ``clustertrain`` command line: ``commands`` (submit, run, list, cancel, logs, doctor),
``runs`` (status, plot, results), ``cluster`` (the local cluster), ``options`` (the flags built
from the spec's fields)."""

from clustertrain.cli.commands import cli, main

__all__ = ["cli", "main"]

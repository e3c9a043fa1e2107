"""Where jobs run: ``slurm`` (a Slurm cluster, through its commands), ``local`` (this machine,
without Slurm) and ``remote`` (a login node's clustertrain over ``ssh``, with a ``snapshot`` of
the code and your ``hosts`` file), behind one interface (``base``); ``preflight`` and ``doctor``
read a Slurm cluster's limits, ``prepare`` runs a job's commands on the submit host,
``submission`` writes the run folder and queues the job.

A backend is registered here by name, the name a run folder records (job.json's ``backend``);
its module is imported when a run of it is first asked about.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustertrain.backends.base import Backend

# name: (module, class). A new backend is a module and a line here.
BACKENDS = {
    "slurm": ("clustertrain.backends.slurm", "SlurmBackend"),
    "local": ("clustertrain.backends.local", "LocalBackend"),
}


def named(name: str) -> Backend:
    """A backend by its registered name, with its defaults (Slurm: this environment's)."""
    module, cls = BACKENDS[name]
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend

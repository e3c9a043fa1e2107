"""The Slurm backend, every Slurm fact in one package (as submitit's ``slurm/slurm.py``):

commands.py      the one module that calls Slurm's commands, through a runner tests replace
parse.py         what those commands print, read (pure functions)
cluster_info.py  what a cluster offers: partitions, nodes, limits
preflight.py     refuse a job the cluster could never run, before it queues (pure)
doctor.py        ``clustertrain doctor``: what this host and its cluster can do
backend.py       ``SlurmBackend``, the interface of ``clustertrain.backends.base``
"""

from __future__ import annotations

from .backend import SlurmBackend
from .commands import Slurm, SlurmUnreachable, checked_job_id, slurm_environ
from .parse import (
    lacks_configuration,
    parse_accounting,
    parse_allocations,
    parse_nodes,
    parse_partitions,
    parse_sacct,
    parse_scontrol_job,
)

__all__ = [
    "Slurm",
    "SlurmBackend",
    "SlurmUnreachable",
    "checked_job_id",
    "lacks_configuration",
    "parse_accounting",
    "parse_allocations",
    "parse_nodes",
    "parse_partitions",
    "parse_sacct",
    "parse_scontrol_job",
    "slurm_environ",
]

"""What a Slurm cluster offers, as ``sinfo`` and ``scontrol`` report it: its partitions, its
nodes and their limits. :class:`clustertrain.backends.slurm.Slurm` fills these (``cluster_info``);
preflight and doctor read them."""

from __future__ import annotations

import re
from dataclasses import dataclass

# sinfo's short node states that cannot run a job now or soon (sinfo(1), NODE STATE CODES).
_UNUSABLE = ("down", "drain", "drng", "fail", "futr", "inval", "maint", "npc", "reboot")
_GPU_GRES = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    memory_mb: int
    gpus: int
    state: str

    @property
    def usable(self) -> bool:
        return not self.state.rstrip("*~#!%$@^-").startswith(_UNUSABLE)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_nodes: int | None
    max_time_s: int | None
    state: str


@dataclass(frozen=True)
class ClusterInfo:
    version: str
    partitions: tuple[Partition, ...]
    nodes: tuple[Node, ...]
    max_array_size: int | None = None  # MaxArraySize: array indices must stay below it
    # The container runtimes this cluster offers (None: not asked), and why each other is not.
    container_runtimes: frozenset[str] | None = None
    missing_runtimes: tuple[tuple[str, str], ...] = ()

    def partition(self, name: str | None) -> Partition | None:
        for part in self.partitions:
            if part.name == name or (name is None and part.default):
                return part
        return None


def gpu_count(gres: str) -> int:
    """GPUs in sinfo's GRES column: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``(null)``."""
    return sum(int(count) for count in _GPU_GRES.findall(gres))

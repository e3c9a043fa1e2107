"""The local cluster's shape and where its files live."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clustertrain.errors import FieldError
from clustertrain.slurm import local_cluster_dir


def default_state_dir() -> Path:
    return local_cluster_dir()


@dataclass(frozen=True)
class Layout:
    """The cluster's shape. slurmctld listens on ``base_port``, node K's slurmd on base_port+K."""

    nodes: int = 4
    cpus_per_node: int = 8
    gpus_per_node: int = 2
    memory_mb_per_node: int = 4096
    base_port: int = 16817
    state_dir: Path = field(default_factory=default_state_dir)

    def __post_init__(self) -> None:
        for name, low, high in [
            ("nodes", 1, 64),
            ("cpus_per_node", 1, 1024),
            ("gpus_per_node", 0, 64),
            ("memory_mb_per_node", 1, 1 << 24),
            ("base_port", 1024, 65535 - self.nodes),
        ]:
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise FieldError(name, value, f"use a whole number from {low} to {high}")
        object.__setattr__(self, "state_dir", Path(self.state_dir).absolute())

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def ports(self) -> list[int]:
        return [self.base_port + k for k in range(self.nodes + 1)]

    def describe(self) -> str:
        return (
            f"{self.nodes} nodes x {self.cpus_per_node} CPUs, {self.gpus_per_node} GPUs, "
            f"{self.memory_mb_per_node} MB"
        )


def conf_path(state_dir: Path) -> Path:
    return state_dir / "slurm.conf"


def record_path(state_dir: Path) -> Path:
    return state_dir / "state.json"


def munge_socket(state_dir: Path) -> Path:
    return state_dir / "munge" / "munged.socket"


def gpu_files(layout: Layout, node: str) -> list[Path]:
    return [layout.state_dir / "gpu" / node / f"gpu{i}" for i in range(layout.gpus_per_node)]

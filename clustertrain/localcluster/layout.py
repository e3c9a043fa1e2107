"""The local cluster's shape, its addresses, and where its files live."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain.errors import FieldError

NETWORKS = ("namespaces", "loopback")
SLURM_DEFAULT, SLURM_VERSIONS = "22.05", ("22.05", "24.11")  # rootfs.py runs all but the first


def default_state_dir() -> Path:
    """Where ``clustertrain cluster up`` keeps the local cluster (its slurm.conf among it)."""
    return Path(os.environ.get("CLUSTERTRAIN_CLUSTER_DIR", "/var/lib/clustertrain/cluster"))


@dataclass(frozen=True)
class Layout:
    """The cluster's shape. slurmctld listens on ``base_port``, node K's slurmd on base_port+K.

    ``network="namespaces"`` (the default) makes every node a host of its own: its own network
    namespace on a bridge (address ``subnet`` host K+1; the controller is host 1), its own
    hostname and its own hosts file. ``"loopback"`` puts every node on 127.0.0.1, for machines
    where namespaces cannot be made.
    """

    nodes: int = 4
    cpus_per_node: int = 2
    gpus_per_node: int = 2
    memory_mb_per_node: int = 4096
    base_port: int = 16817
    network: str = "namespaces"
    subnet: str = "10.77.0.0/24"
    # How long a node may not answer before Slurm declares it DOWN (its jobs NODE_FAIL). Short
    # here so that tests of a lost node are quick; sites keep Slurm's 300 s or more.
    slurmd_timeout_s: int = 30
    state_dir: Path = field(default_factory=default_state_dir)
    # Which Slurm runs it: this host's packages (22.05), or 24.11 from a root filesystem of
    # Debian 13 (clustertrain.localcluster.rootfs).
    slurm: str = SLURM_DEFAULT
    # Slurm's accounting as sites run it (slurmdbd on MariaDB, clustertrain.localcluster
    # .accounting); False: the job-completion log only, as at sites without slurmdbd.
    accounting: bool = True

    def __post_init__(self) -> None:
        for name, low, high in [
            ("nodes", 1, 64),
            ("cpus_per_node", 1, 1024),
            ("gpus_per_node", 0, 64),
            ("memory_mb_per_node", 1, 1 << 24),
            ("base_port", 1024, 65535 - self.nodes - 1),
            ("slurmd_timeout_s", 10, 3600),
        ]:
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise FieldError(name, value, f"use a whole number from {low} to {high}")
        if self.slurm not in SLURM_VERSIONS:
            raise FieldError("slurm", self.slurm, f"use one of {', '.join(SLURM_VERSIONS)}")
        if self.network not in NETWORKS:
            raise FieldError("network", self.network, f"use one of {', '.join(NETWORKS)}")
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError:
            raise FieldError(
                "subnet", self.subnet, "use an IPv4 network such as 10.77.0.0/24"
            ) from None
        if not net.is_private or net.num_addresses - 2 < self.nodes + 2:
            raise FieldError(
                "subnet",
                self.subnet,
                f"use a private IPv4 network with room for {self.nodes + 2} hosts",
            )
        object.__setattr__(self, "state_dir", Path(self.state_dir).absolute())

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def ports(self) -> list[int]:
        """slurmctld's, each node's slurmd's, then slurmdbd's (with accounting)."""
        count = self.nodes + 1 + (1 if self.accounting else 0)
        return [self.base_port + k for k in range(count)]

    @property
    def dbd_port(self) -> int:
        return self.base_port + self.nodes + 1

    @property
    def prefix_length(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen

    @property
    def controller_address(self) -> str:
        return self.addresses[0]

    @property
    def node_addresses(self) -> dict[str, str]:
        return dict(zip(self.node_names, self.addresses[1:], strict=True))

    @property
    def login_address(self) -> str:
        """The login node's address, after the nodes' (namespace network only)."""
        return str(ipaddress.IPv4Network(self.subnet).network_address + self.nodes + 2)

    @property
    def host_addresses(self) -> dict[str, str]:
        """Every host of the namespace network but the controller: the nodes, then login."""
        return {**self.node_addresses, "login": self.login_address}

    @property
    def addresses(self) -> list[str]:
        """The controller's address, then each node's."""
        if self.network == "loopback":
            return ["127.0.0.1"] * (self.nodes + 1)
        hosts = ipaddress.IPv4Network(self.subnet).hosts()
        return [str(next(hosts)) for _ in range(self.nodes + 1)]

    def describe(self) -> str:
        return (
            f"{self.nodes} nodes x {self.cpus_per_node} CPUs, {self.gpus_per_node} GPUs, "
            f"{self.memory_mb_per_node} MB, {self.network} network, Slurm {self.slurm}"
            + ("" if self.accounting else ", no accounting")
        )


def conf_path(state_dir: Path) -> Path:
    return state_dir / "slurm.conf"


def record_path(state_dir: Path) -> Path:
    return state_dir / "state.json"


def munge_socket(state_dir: Path) -> Path:
    return state_dir / "munge" / "munged.socket"


def hosts_file(state_dir: Path, node: str) -> Path:
    """The hosts file node ``node`` sees as /etc/hosts (namespace network only)."""
    return state_dir / "hosts" / node


def dns_conf(state_dir: Path) -> Path:
    """dnsmasq's configuration: the cluster's names, served on the bridge (namespace network)."""
    return state_dir / "dnsmasq.conf"


def resolv_file(state_dir: Path) -> Path:
    """The file every node sees as /etc/resolv.conf (namespace network only)."""
    return state_dir / "resolv.conf"


def clients_dir(state_dir: Path) -> Path:
    """Slurm's commands for a cluster whose Slurm is not this host's (clustertrain.localcluster
    .rootfs); put it first on PATH."""
    return state_dir / "bin"


def gpu_files(layout: Layout, node: str) -> list[Path]:
    return [layout.state_dir / "gpu" / node / f"gpu{i}" for i in range(layout.gpus_per_node)]

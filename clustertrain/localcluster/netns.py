"""Separate hosts on one machine: a network and UTS namespace per node, on a private bridge.

Each node K gets a network namespace with ``lo`` and ``eth0`` (one end of a veth pair whose
other end joins the cluster's bridge), the address ``Layout.node_addresses[K]``, and, through
the mount and UTS namespaces its slurmd starts in, its own hostname, hosts file and
resolv.conf. The bridge carries the controller's address in the host's namespace, so
slurmctld, the cluster's name server and the Slurm commands stay where the user is. The
namespaces have no route beyond the subnet: nothing in them can send traffic to any other
address.

Names derive from the cluster's id (``Names``), so ``down`` finds everything ``up`` made, even
after a crash; removing what is not there is not an error.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clustertrain.errors import UserError

from .layout import Layout


@dataclass(frozen=True)
class Names:
    """Kernel names of one cluster's network objects (interface names fit in 15 bytes)."""

    cluster_id: str
    nodes: list[str]

    @property
    def bridge(self) -> str:
        return f"ct{self.cluster_id[:6]}br"

    def namespace(self, node: str) -> str:
        return f"clustertrain-{self.cluster_id[:6]}-{node}"

    def host_link(self, node: str) -> str:
        return f"ct{self.cluster_id[:6]}{node.removeprefix('node')}"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"network namespaces: `ip {' '.join(args)}` failed: {detail}; "
            "on a machine that cannot make them, use `clustertrain cluster up --layout loopback`"
        )


def check_subnet_free(layout: Layout) -> None:
    """Refuse a subnet that overlaps one this machine already routes: its traffic is not ours."""
    net = ipaddress.IPv4Network(layout.subnet)
    for line in _ip("-o", "-4", "route", "show", "table", "all").stdout.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "local", "broadcast", "unreachable", "blackhole", "prohibit"):
            dest = line.split()[1] if len(line.split()) > 1 else ""
        try:
            other = ipaddress.IPv4Network(dest, strict=False)
        except ValueError:
            continue
        if other.prefixlen > 0 and not other.is_loopback and other.overlaps(net):
            raise UserError(
                f"subnet: {layout.subnet} overlaps {other}, which this machine already routes; "
                "choose another private subnet"
            )


def create(layout: Layout, names: Names) -> None:
    """The bridge with the controller's address, then each host's namespace and link (the
    nodes', then the login node's)."""
    prefix = layout.prefix_length
    _must("link", "add", names.bridge, "type", "bridge")
    _must("addr", "add", f"{layout.controller_address}/{prefix}", "dev", names.bridge)
    _must("link", "set", names.bridge, "up")
    for node, address in layout.host_addresses.items():
        ns, link = names.namespace(node), names.host_link(node)
        _must("netns", "add", ns)
        _must("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _must("link", "set", link, "master", names.bridge, "up")
        _must("-n", ns, "link", "set", "lo", "up")
        _must("-n", ns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
        _must("-n", ns, "link", "set", "eth0", "up")


def remove(names: Names) -> None:
    """Delete every link, namespace and the bridge ``create`` makes; missing ones are fine."""
    for node in names.nodes:
        _ip("link", "del", names.host_link(node))
        _ip("netns", "del", names.namespace(node))
    _ip("link", "del", names.bridge)


def leftovers(names: Names) -> list[str]:
    """What of this cluster's network objects still exists."""
    links = _ip("-o", "link", "show").stdout
    spaces = set(_ip("netns", "list").stdout.split())
    found = [
        n
        for n in [names.bridge, *map(names.host_link, names.nodes)]
        if f" {n}:" in links or f" {n}@" in links
    ]
    return found + [names.namespace(n) for n in names.nodes if names.namespace(n) in spaces]


def processes(names: Names) -> dict[str, list[int]]:
    """The live processes in each host's network namespace (the nodes', the login node's), by
    host: what `down` must end before the namespaces go, or nothing would ever end them."""
    found = {}
    for node in names.nodes:
        pids = [int(p) for p in _ip("netns", "pids", names.namespace(node)).stdout.split()]
        if pids:
            found[node] = pids
    return found


def fail(names: Names, node: str, cut_link: bool) -> list[int]:
    """Make ``node`` disappear as a host does: every process in its namespace killed (slurmd,
    the job steps, the ranks), or, with ``cut_link``, its link down and everything left
    running unreachable. Returns the PIDs killed."""
    if cut_link:
        _must("link", "set", names.host_link(node), "down")
        return []
    pids = [int(p) for p in _ip("netns", "pids", names.namespace(node)).stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def enter(names: Names, node: str, hosts: Path, resolv: Path, argv: list[str]) -> list[str]:
    """``argv`` run as host ``node``: in its network namespace, with its hostname, hosts file and
    resolv.conf (the cluster's name server on the bridge; the host's is beyond the subnet).

    nsenter and unshare exec in place (no fork), so the PID recorded for the daemon is the
    daemon's. ``ip netns exec`` would remount /sys, which slurmd 22.05 refuses (cgroup error).
    Mounts propagate from the host into the node (slave), so the node sees the same files.
    """
    script = (
        'hostname "$0" && mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf'
        ' && shift 2 && exec "$@"'
    )
    return [
        "nsenter",
        f"--net=/run/netns/{names.namespace(node)}",
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "slave",
        "sh",
        "-c",
        script,
        node,
        str(hosts),
        str(resolv),
        *argv,
    ]

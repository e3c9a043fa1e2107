"""Checks each node runs before training: ``python -m clustertrain.nodecheck probe|verdict``.

The batch script runs ``probe`` once per node (through srun), then ``verdict`` on the first
node. A node that resolves the head node differently, a loopback answer across hosts, or a
rendezvous port already taken would otherwise show up as a rendezvous that hangs until its
timeout; here it is one line naming the node and the reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any


def probe(head: str, port: int, is_head: bool) -> dict[str, Any]:
    """What this node sees: its names, the head node's address, and (on the head) the port."""
    found: dict[str, Any] = {
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "host": socket.gethostname(),
        "head": head,
    }
    try:
        infos = socket.getaddrinfo(head, port, socket.AF_INET, socket.SOCK_STREAM)
        found["address"] = infos[0][4][0]
    except OSError as exc:
        found["error"] = f"cannot resolve {head}: {exc.strerror or exc}"
    if is_head:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As torch's TCPStore does: a requeued job reuses its port, and the last attempt's
            # connections linger in TIME_WAIT for 60 s; only a live listener means "in use".
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
                sock.listen()
            except OSError as exc:
                found["error"] = f"rendezvous port {port} is in use ({exc.strerror})"
    return found


def verdict(probes: list[dict[str, Any]], nodes: int) -> str | None:
    """The first problem the probes show, naming the node; None when all is well."""
    if len(probes) != nodes:
        seen = ", ".join(sorted(p["node"] for p in probes)) or "none"
        return f"only {len(probes)} of {nodes} nodes answered the node check (seen: {seen})"
    for found in probes:
        if "error" in found:
            return f"{found['node']}: {found['error']}"
    addresses = {p["address"] for p in probes}
    if len(addresses) > 1:
        seen = ", ".join(f"{p['node']}={p['address']}" for p in probes)
        return f"nodes resolve the head node {probes[0]['head']} differently ({seen}); fix DNS"
    address = addresses.pop()
    hosts = {p["host"] for p in probes}
    if ipaddress.ip_address(address).is_loopback and len(hosts) > 1:
        return (
            f"the head node {probes[0]['head']} resolves to the loopback address {address}, "
            f"but the nodes are {len(hosts)} different hosts: fix its /etc/hosts entry"
        )
    return None


def main(argv: list[str]) -> int:
    command, folder = argv[0], Path(argv[1])
    if command == "probe":
        found = probe(
            os.environ["HEAD_NODE"],
            int(os.environ["RDZV_PORT"]),
            os.environ.get("SLURM_NODEID") == "0",
        )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{found['node']}.json").write_text(json.dumps(found), encoding="utf-8")
        return 0
    probes = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    problem = verdict(probes, int(argv[2]))
    if problem:
        print(f"clustertrain: node check failed: {problem}", file=sys.stderr)
        return 1
    print(f"clustertrain: node check passed on {len(probes)} node(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

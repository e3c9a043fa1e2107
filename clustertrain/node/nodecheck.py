"""Checks each node runs before training: ``python -m clustertrain.node.nodecheck COMMAND``.

The supervisor runs ``probe`` once per node (through srun), then :func:`judge` on the first
node. A node that resolves the head node to a loopback address or to another address than the
rest, a head node whose name is not one of its own addresses, or a rendezvous port already
taken would otherwise show up as a rendezvous that hangs until its timeout; here it is one line
naming the node and the reason.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from clustertrain.node import qualify, sockprobe, torchprobe
from clustertrain.node.netif import interface_to


def probe(head: str, port: int, is_head: bool) -> dict[str, Any]:
    """What this node sees: its names, the head node's address and the interface to it, and
    (on the head) whether that address is its own and the port is free."""
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
        return found
    found["interface"] = interface_to(found["address"])
    if is_head:
        found.update(_head_problem(head, found["address"], port))
    return found


def _head_problem(head: str, address: str, port: int) -> dict[str, str]:
    """On the head node: is the address it resolves itself to its own, is the port free?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return {
                "error": f"resolves its own name {head} to {address}, which is not one of its "
                "addresses: fix its /etc/hosts entry"
            }
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As torch's TCPStore does: a requeued job reuses its port, and the last attempt's
        # connections linger in TIME_WAIT for 60 s; only a live listener means "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            sock.listen()
        except OSError as exc:
            return {"error": f"rendezvous port {port} is in use ({exc.strerror})"}
    return {}


def verdict(probes: list[dict[str, Any]], nodes: int) -> str | None:
    """The first problem the probes show, naming the node; None when all is well."""
    if len(probes) != nodes:
        seen = ", ".join(sorted(p["node"] for p in probes)) or "none"
        return f"only {len(probes)} of {nodes} nodes answered the node check (seen: {seen})"
    for found in probes:
        if "error" in found:
            return f"{found['node']}: {found['error']}"
    head = probes[0]["head"]
    if len({p["host"] for p in probes}) > 1:
        for found in probes:
            if ipaddress.ip_address(found["address"]).is_loopback:
                return (
                    f"{found['node']}: resolves the head node {head} to the loopback address "
                    f"{found['address']}, but the nodes are different hosts: fix its "
                    f"/etc/hosts entry (Debian's '127.0.1.1 hostname' line is the classic)"
                )
    counts = Counter(p["address"] for p in probes).most_common()
    if len(counts) > 1:
        usual, usual_count = counts[0]
        odd = [p for p in probes if p["address"] != usual]
        seen = ", ".join(f"{p['node']}={p['address']}" for p in odd)
        if usual_count > len(odd):
            return f"{seen}: resolves the head node {head} unlike the others ({usual}); fix DNS"
        seen = ", ".join(f"{p['node']}={p['address']}" for p in probes)
        return f"nodes resolve the head node {head} differently ({seen}); fix DNS"
    return None


def summary(probes: list[dict[str, Any]], seconds: float) -> str:
    """One line for a passed check: its time, the head's address, each node's interface."""
    interfaces = " ".join(f"{p['node']}={p.get('interface') or '?'}" for p in probes)
    return (
        f"node check passed on {len(probes)} node(s) in {seconds:.1f} s: head node "
        f"{probes[0]['head']} is "
        f"{probes[0]['address']}; interface to it: {interfaces}"
    )


def judge(folder: Path, nodes: int, started: float) -> list[dict[str, Any]] | None:
    """The probes of ``folder`` when they show no problem (the summary said), else None (the
    problem said on stderr). ``started``: before the probes, so that srun's time counts."""
    probes = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    problem = verdict(probes, nodes)
    if problem:
        print(f"clustertrain: node check failed: {problem}", file=sys.stderr, flush=True)
        return None
    print(f"clustertrain: {summary(probes, time.time() - started)}", flush=True)
    return probes


def _qualify(head: str, port: int, found: dict[str, Any]) -> dict[str, Any]:
    """This node's figures: with the torch probes where a GPU may be (NCCL, as the job's ranks
    will use), else without torch (clustertrain.node.qualify says why)."""
    if qualify.gpus_here():
        return torchprobe.measure(head, port, found.get("interface"))
    rank, world = int(os.environ["SLURM_NODEID"]), int(os.environ["SLURM_STEP_NUM_NODES"])
    return sockprobe.measure(found["address"], port, rank, world)


def main(argv: list[str]) -> int:
    """``probe FOLDER [--qualify]`` on each node: this node's answers in FOLDER/NODE.json
    (with ``--qualify``, its figures too: clustertrain.node.qualify)."""
    command, folder = argv[0], Path(argv[1])
    if command == "probe":
        head, port = os.environ["HEAD_NODE"], int(os.environ["RDZV_PORT"])
        found = probe(head, port, os.environ.get("SLURM_NODEID") == "0")
        if argv[2:] == ["--qualify"] and "error" not in found:
            found.update(_qualify(head, port, found))
        folder.mkdir(parents=True, exist_ok=True)
        if found.get("interface"):
            (folder / f"{found['node']}.ifname").write_text(found["interface"], encoding="utf-8")
        (folder / f"{found['node']}.json").write_text(json.dumps(found), encoding="utf-8")
        return 0
    print("usage: python -m clustertrain.node.nodecheck probe FOLDER [--qualify]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Qualification's probes on this host alone, no Slurm: N probe processes over 127.0.0.1.

    python bench/qualify_local.py [--nodes 2,4,8,16] [--runs 3]

For each N, three ways, each N processes started at once (as srun starts the node check's
tasks), timed from the first start to the last exit (the median of RUNS):

- alone: the node check's own probe (clustertrain.node.nodecheck.probe), no qualification;
- torch: that, then the torch probes (clustertrain.node.torchprobe: a second import of torch,
  a gloo group through a TCPStore, matmuls and pairs in turns), as every CPU node ran them
  before;
- sockets: that, then the probes without torch (clustertrain.node.sockprobe: numpy, TCP
  sockets), as a CPU node runs them now;
- protocol: the socket probes with no matmul, each process with a boot id of its own (faked
  here), so that the head runs each round's pairs at once, as on separate hosts: what the
  joining and the rounds cost when nothing takes turns. (With the matmul, N processes on this
  host's few cores cost N matmuls of CPU at once or in turns alike.)

Every process shares this host's cores and boot id, so the socket probes take turns as on the
local cluster: the figures are indicative of the local cluster, not of separate hosts. Prints a
Markdown table; a run in which a node failed its probe is said and stops the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys
from clustertrain.node import nodecheck, sockprobe, torchprobe
way, port, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
found = nodecheck.probe("127.0.0.1", port, rank == 0)
if way == "torch":
    found.update(torchprobe.measure("127.0.0.1", port, "lo"))
elif way == "sockets":
    found.update(sockprobe.measure(found["address"], port, rank, world))
elif way == "protocol":
    sockprobe.boot_id = lambda: f"{rank:032x}"
    none = lambda: (1.0, "none")
    found.update(sockprobe.measure(found["address"], port, rank, world, 60.0, none))
print(json.dumps(found))
"""
WAYS = ("alone", "torch", "sockets", "protocol")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def once(way: str, world: int) -> tuple[float, list[dict]]:
    """Seconds from the first process's start to the last's exit, and each one's probe."""
    port = _free_port()
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, way, str(port), str(rank), str(world)],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "SLURM_NODEID": str(rank),
                "SLURM_STEP_NUM_NODES": str(world),
                "SLURMD_NODENAME": f"node{rank + 1}",
            },
            stdout=subprocess.PIPE,
        )  # fmt: skip
        for rank in range(world)
    ]
    outs = [proc.communicate(timeout=600)[0] for proc in procs]
    seconds = time.perf_counter() - started
    probes = [json.loads(out) for out in outs]
    failed = [p.get("qualify_error") or p.get("error") for p in probes]
    if any(failed):
        raise SystemExit(f"{way} at {world} nodes: {[f for f in failed if f]}")
    return seconds, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4,8,16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS), help="a few of: " + ", ".join(WAYS))
    args = parser.parse_args()
    ways = [way for way in WAYS if way in args.ways.split(",")]
    print(f"{os.cpu_count()} CPUs; the median of {args.runs} runs, in seconds\n")
    rows = ["| nodes | node check alone | + torch probes | + socket probes | + socket "
            "protocol, no matmul, hosts apart | socket probes' GFLOP/s, MiB/s (min-max) |",
            "|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for world in (int(n) for n in args.nodes.split(",")):
        times: dict[str, list[float]] = {way: [] for way in ways}
        probes: list[dict] = []
        for _ in range(args.runs):
            for way in ways:  # alternated: a busy moment of the host falls on each
                seconds, found = once(way, world)
                times[way].append(seconds)
                probes += found if way == "sockets" else []
        gflops = [p["gflops"] for p in probes]
        links = [p["link_mib_s"] for p in probes if p["link_mib_s"] is not None]
        spread = " ".join(f"{min(f):.0f}-{max(f):.0f}," for f in (gflops, links) if f)
        cells = [f"{statistics.median(times[way]):.2f}" if way in times else "-" for way in WAYS]
        rows.append(f"| {world} | {' | '.join(cells)} | {spread.rstrip(',') or '-'} |")
        print(rows[-1], flush=True)
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()

"""A plain torchrun script (no clustertrain) that reports what its rank sees of its host: its
hostname, the head node's address, its CPUs and threads, the interface gloo was given, the
peers of its own TCP connections after an all-reduce, and the names of those peers, looked up
by address and back. One JSON line per rank."""

import ipaddress
import json
import os
import socket
import time
from pathlib import Path

STARTED = time.time()

import torch  # noqa: E402  (after STARTED: the import is part of the start-up measured)
import torch.distributed as dist  # noqa: E402


def tcp_peers() -> list[str]:
    """Remote addresses of this process's established TCP sockets (/proc/net/tcp, proc(5))."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers = []
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
            address = fields[2].split(":")[0]
            peers.append(str(ipaddress.IPv4Address(bytes.fromhex(address)[::-1])))
    return sorted(set(peers))


def names_of(addresses: list[str]) -> dict[str, dict]:
    """Each address's name, asked as the TCPStore server asks for its clients' (the IPv4-mapped
    form, a name required), and the addresses that name resolves to; else the error."""
    found: dict[str, dict] = {}
    for address in addresses:
        try:
            name = socket.getnameinfo((f"::ffff:{address}", 0, 0, 0), socket.NI_NAMEREQD)[0]
            forward = sorted({info[4][0] for info in socket.getaddrinfo(name, None)})
            found[address] = {"name": name, "addresses": forward}
        except OSError as error:
            found[address] = {"error": str(error)}
    return found


dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
reduced = time.time()
head = os.environ["MASTER_ADDR"]
seen = {
    "rank": dist.get_rank(),
    "world": dist.get_world_size(),
    "sum": int(total.item()),
    "hostname": socket.gethostname(),
    "slurm_node": os.environ.get("SLURMD_NODENAME"),
    "head": head,
    "head_address": socket.gethostbyname(head),
    "cpus": sorted(os.sched_getaffinity(0)),
    "threads": torch.get_num_threads(),
    "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME"),
    "peers": tcp_peers(),
    "peer_names": names_of(tcp_peers()),
    "started": STARTED,
    "reduced": reduced,
}
print("where-am-i " + json.dumps(seen), flush=True)
dist.barrier()
dist.destroy_process_group()

"""The probes in one torch process group: nodes with a GPU (NCCL), as the job's own ranks use.

:func:`measure` joins the nodes through a TCPStore on the rendezvous port, times
:func:`compute` on each node's first GPU (all nodes at once; on CPUs in turns) and runs
:func:`fabric`'s pairwise-quick exchanges with the job's collective backend. Nodes without a
GPU driver take :mod:`clustertrain.node.sockprobe` instead (numpy and TCP sockets, no torch):
:func:`clustertrain.node.qualify.gpus_here` decides.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from clustertrain.node.qualify import (
    EXCHANGES,
    GPU_REPEAT,
    JOIN_S,
    MATMUL_N,
    MATMUL_REPEAT,
    MIN_EXCHANGES,
    PAIR_BUDGET_S,
    PAYLOAD,
    pairs,
)


def measure(head: str, port: int, interface: str | None) -> dict[str, Any]:
    """This node's figures (``gflops``, ``link_mib_s``), or ``qualify_error``, measured in one
    process group of the nodes (:func:`_join`)."""
    try:
        import torch  # lazy: only a qualifying node check needs it
        import torch.distributed as dist  # lazy: as torch
    except ImportError:
        return {"qualify_error": "torch is not importable with the job's Python"}
    try:
        rank, world = _join(torch, dist, head, port, interface)
    except Exception as exc:  # noqa: BLE001 - a failed probe is a verdict, said in one line
        return {"qualify_error": f"joining the others: {type(exc).__name__}: {str(exc)[:200]}"}
    try:
        found: dict[str, Any] = {"gflops": _in_turns(torch, dist, rank, world)}
        found["link_mib_s"] = fabric(torch, dist, rank, world)
        return found
    except Exception as exc:  # noqa: BLE001 - as above
        return {"qualify_error": f"link probe: {type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        dist.destroy_process_group()


def _join(torch: Any, dist: Any, head: str, port: int, interface: str | None) -> tuple[int, int]:
    """One process group of the step's nodes, the job's collective backend, rendezvous on the
    head node's port (free: the node check said so; the launchers bind it after this ends)."""
    rank, world = int(os.environ["SLURM_NODEID"]), int(os.environ["SLURM_STEP_NUM_NODES"])
    if interface:
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(name, interface)
    store = dist.TCPStore(head, port, world, rank == 0, timedelta(seconds=JOIN_S))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=JOIN_S))  # fmt: skip
    return rank, world


def _in_turns(torch: Any, dist: Any, rank: int, world: int) -> float:
    """:func:`compute` on every node: at once on GPUs (each node's own), in turns on CPUs, the
    others waiting, so that nodes sharing cores (this project's local cluster) are each
    timed alone, as separate hosts would be (about 0.25 s a node)."""
    if torch.cuda.is_available():
        dist.barrier()
        return compute(torch)
    figure = 0.0
    for turn in range(world):
        dist.barrier()
        if turn == rank:
            figure = compute(torch)
    dist.barrier()
    return figure


def compute(torch: Any) -> float:
    """GFLOP/s of a fixed matmul: the node's first GPU, else one CPU thread."""
    cuda = torch.cuda.is_available()
    device, repeat = ("cuda", GPU_REPEAT) if cuda else ("cpu", MATMUL_REPEAT)
    torch.set_num_threads(1)
    a = torch.ones(MATMUL_N, MATMUL_N, device=device)
    b = torch.ones(MATMUL_N, MATMUL_N, device=device)
    torch.mm(a, b)  # warm-up: allocations, kernels
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeat):
        torch.mm(a, b)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return 2 * MATMUL_N**3 * repeat / seconds / 1e9


def fabric(torch: Any, dist: Any, rank: int, world: int) -> float | None:
    """This node's best exchange's MiB/s, in the rounds of :func:`pairs` (None alone).

    One pair at a time, the others waiting: on nodes that share anything (this project's local
    cluster shares two cores), a pair measured while other pairs run is measured against them.
    Each pair first sends one small message (not counted: a first message may wait for what a
    first message waits for), then exchanges the payload at least MIN_EXCHANGES times and up to
    EXCHANGES while PAIR_BUDGET_S is not spent, and keeps its best: one slow exchange is the
    scheduler's, three are the link's. The lower rank decides, and tells the other."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    payload, go = torch.ones(PAYLOAD // 4, device=device), torch.zeros(1, device=device)
    best = None
    for round_ in pairs(world):
        for low, high in round_:
            dist.barrier()
            if rank not in (low, high):
                continue
            peer = high if rank == low else low
            _exchange(dist, go, rank, peer)  # not counted: the pair's first message
            started = time.perf_counter()
            for count in range(1, EXCHANGES + 1):
                speed = _exchange(dist, payload, rank, peer)
                best = speed if best is None else max(best, speed)
                if rank == low:
                    spent = time.perf_counter() - started
                    more = count < MIN_EXCHANGES or (count < EXCHANGES and spent < PAIR_BUDGET_S)
                    go.fill_(1.0 if more else 0.0)
                    dist.send(go, peer)
                else:
                    dist.recv(go, peer)
                if go.item() == 0.0:
                    break
    dist.barrier()
    return best


def _exchange(dist: Any, payload: Any, rank: int, peer: int) -> float:
    """MiB/s of one payload each way with ``peer``: the lower rank sends first."""
    started = time.perf_counter()
    if rank < peer:
        dist.send(payload, peer)
        dist.recv(payload, peer)
    else:
        dist.recv(payload, peer)
        dist.send(payload, peer)
    if payload.is_cuda:
        import torch  # lazy: only a qualifying node check needs it

        torch.cuda.synchronize()
    return 2 * PAYLOAD / (1 << 20) / (time.perf_counter() - started)

"""Qualification: is every node of the allocation as fast as the others, before training?

The node check (:mod:`clustertrain.node.nodecheck`) runs :func:`measure` on every node of the
allocation, spares included, when the job asks for it (``qualify``):

- **compute**: a fixed matmul, timed (on the node's first GPU when it has one, else one CPU
  thread): the node's figure is GFLOP/s.
- **fabric**, "pairwise-quick": the nodes join one process group with the job's own collective
  backend (NCCL with GPUs, gloo on CPUs) through the rendezvous port, and in at most
  ``ROUNDS`` rounds of a round-robin schedule each pair sends a fixed payload both ways, up to
  ``EXCHANGES`` times (a pair at a time: see :func:`fabric`). A node's figure is its best
  pair's MiB/s: a slow link slows every pair of its node, a healthy node has one fast pair at
  least. Two nodes alone cannot tell
  whose link is slow: their one pair is both nodes' figure, and neither is flagged.

:func:`flag` is the verdict, pure: a node whose figure is worse than the allocation's median by
more than ``compute_threshold`` or ``link_threshold`` times (each set from the measured spread
of healthy nodes, which differs by far: docs/qualification.md), or that failed a probe, is
flagged with its figure. The
supervisor then swaps it for a spare, or ends the job, or trains and says so
(:func:`clustertrain.node.policy.qualified`).
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Any

# The fixed work: MATMUL_N x MATMUL_N float32 products, MATMUL_REPEAT times (about 0.25 s of
# one CPU thread here: several of the scheduler's 100 ms periods, so that a CPU quota shows
# whole: 0.07 s of it read a node at 25 % of a CPU as only 2.3-3.6x slower); PAYLOAD
# bytes each way between the two nodes of a pair, MIN_EXCHANGES times, then up to EXCHANGES
# times while the pair has spent less than PAIR_BUDGET_S (the best counts); ROUNDS rounds of
# pairs at most.
MATMUL_N, MATMUL_REPEAT, GPU_REPEAT = 384, 200, 200
PAYLOAD, MIN_EXCHANGES, EXCHANGES, PAIR_BUDGET_S = 256 << 10, 3, 8, 0.5
ROUNDS = 3
JOIN_S = 60.0


def pairs(count: int, rounds: int = ROUNDS) -> list[list[tuple[int, int]]]:
    """A round-robin schedule (the circle method) of ``count`` nodes, its first ``rounds``
    rounds: in each, every node is in one pair at most (an odd count leaves one out)."""
    ring = list(range(count)) + ([-1] if count % 2 else [])
    size, schedule = len(ring), []
    for _ in range(min(rounds, size - 1)):
        round_ = [(ring[i], ring[size - 1 - i]) for i in range(size // 2)]
        schedule.append([(min(a, b), max(a, b)) for a, b in round_ if a >= 0 and b >= 0])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return schedule


def flag(probes: list[dict[str, Any]], compute: float, link: float) -> dict[str, str]:
    """The flagged nodes, each with why: a failed probe, or a compute or link figure worse than
    the median of the nodes' by more than ``compute`` or ``link`` times."""
    flagged = {p["node"]: f"qualification failed: {p['qualify_error']}" for p in probes
               if p.get("qualify_error")}  # fmt: skip
    for key, unit, what, threshold in (("gflops", "GFLOP/s", "compute", compute),
                                       ("link_mib_s", "MiB/s", "link", link)):  # fmt: skip
        figures = {p["node"]: p[key] for p in probes if isinstance(p.get(key), (int, float))}
        if len(figures) < 2:
            continue
        median = statistics.median(figures.values())
        for node, figure in figures.items():
            if node not in flagged and figure * threshold < median:
                flagged[node] = (
                    f"{what} {figure:.3g} {unit}, {median / max(figure, 1e-9):.1f}x slower than "
                    f"the median {median:.3g} {unit}"
                )
    return flagged


def summary(probes: list[dict[str, Any]]) -> str:
    """Each node's figures, one word each: ``node1=2.1GF/s,118MiB/s``."""
    return " ".join(
        f"{p['node']}={_figure(p.get('gflops'), 'GF/s')},{_figure(p.get('link_mib_s'), 'MiB/s')}"
        for p in probes
    )


def _figure(value: Any, unit: str) -> str:
    return f"{value:.3g}{unit}" if isinstance(value, (int, float)) else "-"


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

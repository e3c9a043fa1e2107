"""Qualification: is every node of the allocation as fast as the others, before training?

The node check (:mod:`clustertrain.node.nodecheck`) measures every node of the allocation,
spares included, when the job asks for it (``qualify``), one probe process a node:

- **compute**: a fixed matmul, timed (on the node's first GPU when it has one, else one CPU
  thread): the node's figure is GFLOP/s.
- **fabric**, "pairwise-quick": in at most ``ROUNDS`` rounds of a round-robin schedule
  (:func:`pairs`) each pair sends a fixed payload both ways, up to ``EXCHANGES`` times. A
  node's figure is its best pair's MiB/s: a slow link slows every pair of its node, a healthy
  node has one fast pair at least. Two nodes alone cannot tell whose link is slow: their one
  pair is both nodes' figure, and neither is flagged.

Two ways to run them, chosen per node by :func:`gpus_here`:

- a node with a GPU driver: :mod:`clustertrain.node.torchprobe`, the nodes in one torch process
  group with the job's backend (NCCL), the matmul on the first GPU, all nodes at once;
- a node without one (its ranks will use gloo on CPUs): :mod:`clustertrain.node.sockprobe`,
  no torch: the matmul with numpy on one thread, the links over plain TCP sockets, the head
  node's probe handing out the schedule on the rendezvous port. There, nodes that share a host
  (the same kernel boot id: containers or namespaces on one machine, as this project's local
  cluster's nodes are) take turns, for their matmuls and their pairs alike, so that each is
  timed alone as separate hosts would be; nodes on different hosts run at once
  (:func:`waves`). On separate hosts it costs one matmul and ``ROUNDS`` rounds of pairs,
  whatever the node count.

:func:`flag` is the verdict, pure: a node whose figure is worse than the allocation's median by
more than ``compute_threshold`` or ``link_threshold`` times (each set from the measured spread
of healthy nodes, which differs by far: docs/qualification.md), or that failed a probe, is
flagged with its figure. The supervisor then swaps it for a spare, or ends the job, or trains
and says so (:func:`clustertrain.node.policy.qualified`).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

# The fixed work: MATMUL_N x MATMUL_N float32 products, MATMUL_REPEAT times (about 0.25 s of
# one CPU thread here: several of the scheduler's 100 ms periods, so that a CPU quota shows
# whole: 0.07 s of it read a node at 25 % of a CPU as only 2.3-3.6x slower); PAYLOAD
# bytes each way between the two nodes of a pair, MIN_EXCHANGES times, then up to EXCHANGES
# times while the pair has spent less than PAIR_BUDGET_S (the best counts); ROUNDS rounds of
# pairs at most. JOIN_S bounds the joining and each wave of steps after it (the socket
# probes' member waits twice that for its next order: the head's join window, then a wave).
MATMUL_N, MATMUL_REPEAT, GPU_REPEAT = 384, 200, 200
PAYLOAD, MIN_EXCHANGES, EXCHANGES, PAIR_BUDGET_S = 256 << 10, 3, 8, 0.5
ROUNDS = 3
JOIN_S = 60.0

# What torch.cuda.is_available() needs on Linux, looked for without importing torch: the
# NVIDIA driver (/proc/driver/nvidia, /dev/nvidia0), ROCm's /dev/kfd, WSL's /dev/dxg. A node
# with none of them has no GPU its ranks could use: they take gloo on CPUs
# (clustertrain.rank.env.pick_device). Any of them: the torch probes, as before.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def gpus_here(exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Whether this node may have a GPU its ranks use (then the torch probes run)."""
    return any(exists(path) for path in GPU_DRIVER_PATHS)


def waves(hosts: Sequence[Sequence[str | None]]) -> list[list[int]]:
    """Which steps run at once: ``hosts[i]`` are the hosts step ``i`` runs on (a node's boot
    id for its matmul, two for a pair's exchange; None: unknown). Steps that share a host go
    in different waves, in order (first fit), so that a step is timed alone on its host; an
    unknown host shares with every other. Separate hosts: one wave; one host: one step a
    wave, today's turns."""
    placed: list[list[int]] = []
    used: list[set[str | None]] = []
    for step, mine in enumerate(hosts):
        for wave, taken in zip(placed, used, strict=True):
            if None not in taken and None not in mine and not taken.intersection(mine):
                wave.append(step)
                taken.update(mine)
                break
        else:
            placed.append([step])
            used.append(set(mine))
    return placed


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

"""Stragglers while training: a node whose ranks' own work is slower than the other nodes'.

In synchronous data-parallel training every rank's step takes as long as the slowest rank's:
the others wait for it in the gradients' all-reduce. So a step's wall time names no one. What
does is each rank's time in a section with no collective in it (its forward pass, say), which
the training script marks with ``runtime.compute()``, as NVIDIA's resiliency extension has
scripts mark theirs; the heartbeat carries the running total beside the step
(:mod:`clustertrain.rank.runtime`).

The watchdog reads the heartbeats as it polls (clustertrain.node.beats) and hands them to a
:class:`Scorer`: per rank, the compute seconds per step over the last ``window_s``; per node,
the median of its ranks'; its score, that over the median of the *other* nodes' (relative, as
NVRx's scores are; with two nodes, the other one). A node whose score stays above ``threshold``
for ``hold_s`` is named once: ``straggler: node3 (ranks 4-5) at 1.9x the median compute time
since step 120``.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from clustertrain.node.beats import Beat

WINDOW_S, HOLD_S = 8.0, 10.0


@dataclass
class Scorer:
    threshold: float
    window_s: float = WINDOW_S
    hold_s: float = HOLD_S
    history: dict[int, deque[Beat]] = field(default_factory=dict)
    slow_since: dict[str, tuple[float, int]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)

    def add(self, beat: Beat) -> None:
        seen = self.history.setdefault(beat.rank, deque())
        if not seen or beat.step != seen[-1].step:
            seen.append(beat)
        while len(seen) > 2 and beat.time - seen[1].time >= self.window_s:
            seen.popleft()

    def per_step(self, rank: int) -> float | None:
        """The rank's compute seconds per step over its window; None before it has one."""
        seen = self.history.get(rank)
        if not seen or len(seen) < 2 or seen[-1].time - seen[0].time < self.window_s / 2:
            return None
        steps = seen[-1].step - seen[0].step
        return (seen[-1].compute_s - seen[0].compute_s) / steps if steps > 0 else None

    def scores(self, nodes: dict[int, str]) -> dict[str, float]:
        """Each node's median per-step compute time over the other nodes' median."""
        by_node: dict[str, list[float]] = {}
        for rank, node in nodes.items():
            value = self.per_step(rank)
            if value is not None and value > 0:
                by_node.setdefault(node, []).append(value)
        medians = {node: statistics.median(values) for node, values in by_node.items()}
        found = {}
        for node, value in medians.items():
            others = [v for n, v in medians.items() if n != node]
            if others:
                found[node] = value / statistics.median(others)
        return found

    def update(self, now: float, nodes: dict[int, str]) -> list[str]:
        """The lines for nodes that have just stayed slow for ``hold_s``, each said once."""
        said = []
        step = max((seen[-1].step for seen in self.history.values() if seen), default=0)
        for node, score in self.scores(nodes).items():
            if score <= self.threshold:
                self.slow_since.pop(node, None)
                continue
            since, at_step = self.slow_since.setdefault(node, (now, step))
            if now - since >= self.hold_s and node not in self.named:
                self.named.add(node)
                ranks = sorted(rank for rank, n in nodes.items() if n == node)
                said.append(
                    f"straggler: {node} ({_ranks(ranks)}) at {score:.1f}x the median compute "
                    f"time since step {at_step}"
                )
        return said


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 4-5``, ``ranks 0, 2``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))

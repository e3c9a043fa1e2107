"""What ``clustertrain top`` shows of a running job: each node's figures and each rank's progress.

The nodes' figures are what ``python -m clustertrain.node.top`` printed on each node (one JSON
line a node, read here as input: numbers, a node's name, nothing else kept); the ranks' progress
is their heartbeats (clustertrain.rank.runtime: step, compute seconds, samples, the file's
mtime) read twice by the watchdog's own reader (clustertrain.node.beats), before and after, so
that a step time, samples per second and the straggler score (clustertrain.node.straggler, the
watchdog's own) come from what moved between the two. Pure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from clustertrain import protocol
from clustertrain.node import straggler
from clustertrain.node.beats import UNKNOWN, Beat


@dataclass(frozen=True)
class NodeFigures:
    """One node's line from clustertrain.node.top, checked."""

    node: str
    cpus: int
    cpu_pct: float
    mem_used_kb: int
    mem_total_kb: int
    gpus: tuple[tuple[int, float, float, float], ...] = ()  # index, util %, used, total MiB
    ranks: Mapping[int, tuple[float, int]] = field(default_factory=dict)  # cpu %, rss kB


def node_figures(line: str) -> NodeFigures | None:
    """A node's JSON line, or None for any line that is not one (srun's own words, say)."""
    try:
        data = json.loads(line)
        node = str(data["node"])
        if not protocol.NODE_NAME.fullmatch(node):
            return None
        gpus = tuple(
            (int(g["index"]), _number(g["util_pct"]), _number(g["mem_used_mib"]),
             _number(g["mem_total_mib"]))
            for g in data.get("gpus", [])[:64]
        )  # fmt: skip
        ranks = {int(r["rank"]): (_number(r["cpu_pct"]), int(r["rss_kb"])) for r in data["ranks"]}
        memory = int(data["mem_used_kb"]), int(data["mem_total_kb"])
        return NodeFigures(node, int(data["cpus"]), _number(data["cpu_pct"]), *memory, gpus, ranks)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _number(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


@dataclass(frozen=True)
class RankRow:
    rank: int
    node: str
    step: int
    ago_s: float | None  # since its last beat
    step_s: float | None  # seconds a step, between the two readings
    samples_per_s: float | None
    cpu_pct: float | None
    rss_kb: int | None


@dataclass(frozen=True)
class View:
    job_id: str
    nodes: tuple[NodeFigures, ...]
    ranks: tuple[RankRow, ...]
    scores: Mapping[str, float]  # node: straggler score (its compute time over the others')
    silent: tuple[str, ...] = ()  # the job's nodes that sent no figures

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nodes": [asdict(n) | {"straggler": self.scores.get(n.node)} for n in self.nodes],
            "ranks": [asdict(r) for r in self.ranks],
            "silent": list(self.silent),
        }

    def lines(self) -> list[str]:
        said = [f"job {self.job_id}: {len(self.nodes)} node(s), {len(self.ranks)} rank(s)"]
        if self.silent:
            said[0] += f"; no figures from {', '.join(self.silent)}"
        said.append(f"{'NODE':<12} {'CPU%':>6} {'MEM':>17} {'STRAGGLER':>9}  GPUS")
        for n in self.nodes:
            memory = f"{n.mem_used_kb / 2**20:.1f}/{n.mem_total_kb / 2**20:.1f} GiB"
            score = f"{self.scores[n.node]:.2f}x" if n.node in self.scores else "-"
            gpus = " ".join(f"{i}:{u:.0f}% {m / 1024:.1f}/{t / 1024:.1f}G" for i, u, m, t in n.gpus)
            said.append(f"{n.node:<12} {n.cpu_pct:>6.1f} {memory:>17} {score:>9}  {gpus or '-'}")
        said.append(f"{'RANK':>4} {'NODE':<12} {'STEP':>8} {'AGO':>6} {'STEP_S':>8} "
                    f"{'SAMPLES/S':>10} {'CPU%':>6} {'RSS':>9}")  # fmt: skip
        for r in self.ranks:
            rss = _opt(None if r.rss_kb is None else r.rss_kb / 1024, ".0f", " MiB")
            said.append(
                f"{r.rank:>4} {r.node:<12} {r.step:>8} {_opt(r.ago_s, '.1f', 's'):>6} "
                f"{_opt(r.step_s, '.3f'):>8} {_opt(r.samples_per_s, '.1f'):>10} "
                f"{_opt(r.cpu_pct, '.1f'):>6} {rss:>9}"
            )
        return said


def _opt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def view(
    job_id: str,
    figures: Iterable[NodeFigures],
    before: Mapping[int, Beat],
    after: Mapping[int, Beat],
    now: float,
    silent: tuple[str, ...] = (),
) -> View:
    """What top shows, from the nodes' figures and the heartbeats read ``before`` and ``after``."""
    nodes = tuple(sorted(figures, key=lambda n: n.node))
    on_node = {rank: (n.node, figs) for n in nodes for rank, figs in n.ranks.items()}
    scorer = straggler.Scorer(threshold=math.inf, window_s=0.0)  # scores only, no verdict
    rows = []
    for rank in sorted(set(after) | set(on_node)):
        node, (cpu, rss) = on_node.get(rank, ("?", (None, None)))
        beat, old = after.get(rank), before.get(rank)
        if beat is None:  # a rank that has not beaten yet: its process's figures alone
            rows.append(RankRow(rank, node, 0, None, None, None, cpu, rss))
            continue
        step_s = rate = None
        if old is not None and beat.step > old.step and beat.time > old.time:
            spent = beat.time - old.time
            step_s = spent / (beat.step - old.step)
            rate = (beat.samples - old.samples) / spent if beat.samples > old.samples else None
            scorer.add(old)
            scorer.add(beat)
        ago = round(max(0.0, now - beat.time), 1)
        rows.append(RankRow(rank, beat.node, beat.step, ago, step_s, rate, cpu, rss))
    scores = scorer.scores({rank: b.node for rank, b in after.items() if b.node != UNKNOWN})
    rounded = {node: round(score, 2) for node, score in scores.items()}
    return View(job_id, nodes, tuple(rows), rounded, silent)

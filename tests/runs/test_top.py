"""What `clustertrain top` shows (clustertrain.runs.top): the nodes' lines read as input, and
the ranks' step time, samples/s and straggler score from two readings of their heartbeats."""

from __future__ import annotations

import json

from clustertrain.node import beats
from clustertrain.node.beats import Beat
from clustertrain.runs import top


def _figures(node: str, ranks: dict[int, tuple[float, int]]) -> top.NodeFigures:
    gpu = {"index": 0, "util_pct": 87, "mem_used_mib": 1024, "mem_total_mib": 81559}
    each = [{"rank": r, "pid": 9, "cpu_pct": c, "rss_kb": m} for r, (c, m) in ranks.items()]
    line = {"node": node, "cpus": 4, "cpu_pct": 51.5, "mem_used_kb": 2 << 20,
            "mem_total_kb": 8 << 20, "gpus": [gpu], "ranks": each}  # fmt: skip
    found = top.node_figures(json.dumps(line))
    assert found is not None
    return found


def test_a_nodes_line_that_is_not_its_figures_is_left_out() -> None:
    assert top.node_figures("srun: error: node2: task 0: Exited") is None
    assert top.node_figures('{"node": "-x", "cpus": 1}') is None
    good = {
        "node": "node1",
        "cpus": 1,
        "cpu_pct": 1,
        "mem_used_kb": 1,
        "mem_total_kb": 2,
        "ranks": [],
    }
    assert top.node_figures(json.dumps(good)) is not None
    assert top.node_figures(json.dumps({**good, "cpu_pct": "NaN"})) is None


def test_step_time_samples_and_the_straggler_score_come_from_what_moved() -> None:
    before = {r: Beat(r, f"node{1 + r // 2}", 10, 100.0, 1.0 * r, 40) for r in range(4)}
    after = {
        0: Beat(0, "node1", 20, 102.0, 0.0 + 1.0, 80),  # 10 steps in 2 s, 0.1 s compute each
        1: Beat(1, "node1", 20, 102.0, 1.0 + 1.0, 80),
        2: Beat(2, "node2", 20, 102.0, 2.0 + 3.0, 80),  # node2: 0.3 s a step, 3x
        3: Beat(3, "node2", 20, 102.0, 3.0 + 3.0, 80),
    }
    figures = [
        _figures("node2", {2: (99.0, 2048), 3: (98.0, 2048)}),
        _figures("node1", {0: (50.0, 1024)}),
    ]
    view = top.view("42", figures, before, after, now=103.0)
    assert [n.node for n in view.nodes] == ["node1", "node2"]
    assert view.scores == {"node1": 0.33, "node2": 3.0}
    rank0 = view.ranks[0]
    assert (rank0.step, rank0.ago_s, rank0.step_s, rank0.samples_per_s) == (20, 1.0, 0.2, 20.0)
    assert (rank0.cpu_pct, rank0.rss_kb) == (50.0, 1024) and view.ranks[1].cpu_pct is None
    lines = view.lines()
    assert lines[0] == "job 42: 2 node(s), 4 rank(s)"
    assert lines[2].split() == ["node1", "51.5", "2.0/8.0", "GiB", "0.33x", "0:87%", "1.0/79.6G"]
    assert lines[5].split() == ["0", "node1", "20", "1.0s", "0.200", "20.0", "50.0", "1", "MiB"]
    assert json.loads(json.dumps(view.as_dict()))["nodes"][1]["straggler"] == 3.0


def test_a_rank_that_did_not_step_between_the_readings_has_no_step_time() -> None:
    beat = Beat(0, "node1", 5, 100.0)
    view = top.view("42", [], {0: beat}, {0: beat}, now=130.0, silent=("node1",))
    assert view.ranks[0].step_s is None and view.ranks[0].ago_s == 30.0
    assert view.lines()[0] == "job 42: 0 node(s), 1 rank(s); no figures from node1"


def test_a_rank_whose_node_is_unknown_is_shown_but_scores_no_node() -> None:
    """Its node file missing or naming no node (clustertrain.node.beats): "?" is no node."""
    nodes = ["node1", "node2", beats.UNKNOWN]
    before = {r: Beat(r, node, 10, 100.0, 1.0, 40) for r, node in enumerate(nodes)}
    after = {r: Beat(r, nodes[r], 20, 102.0, 1.0 + (1.0, 3.0, 9.0)[r], 80) for r in before}
    view = top.view("42", [], before, after, now=103.0)
    assert view.scores == {"node1": 0.33, "node2": 3.0}
    assert [row.node for row in view.ranks] == nodes

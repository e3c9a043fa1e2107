"""Straggler scores (clustertrain.node.straggler) from heartbeats, without a cluster: a node
whose ranks' compute time per step stays above the threshold times the other nodes' is named
once, after the hold; noise under the threshold, or a slow spell shorter than the hold, is not.
The heartbeat line the runtime writes is what the watchdog reads (a real process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clustertrain import protocol
from clustertrain.node import straggler
from clustertrain.node.beats import Beat
from clustertrain.node.watchdog import Stragglers

NODES = {0: "node1", 1: "node1", 2: "node2", 3: "node2", 4: "node3", 5: "node3"}


def _feed(scorer: straggler.Scorer, seconds: int, per_step: dict[str, float]) -> list[str]:
    """One beat a second per rank, a step each; each node's ranks spend ``per_step`` seconds a
    step in compute. Returns what the scorer said along the way."""
    said: list[str] = []
    totals = dict.fromkeys(NODES, 0.0)
    for t in range(seconds):
        for rank, node in NODES.items():
            totals[rank] += per_step[node]
            scorer.add(Beat(rank, node, t, float(t), totals[rank]))
        said += scorer.update(float(t), NODES)
    return said


def test_a_node_that_stays_slow_is_named_once_with_its_ranks_and_figure() -> None:
    scorer = straggler.Scorer(threshold=1.5)
    said = _feed(scorer, 60, {"node1": 0.010, "node2": 0.019, "node3": 0.011})
    assert said == ["straggler: node2 (ranks 2-3) at 1.8x the median compute time since step 4"]


def test_noise_under_the_threshold_and_a_short_slow_spell_name_no_one() -> None:
    assert _feed(straggler.Scorer(1.5), 60, {"node1": 0.010, "node2": 0.014, "node3": 0.011}) == []
    scorer = straggler.Scorer(1.5, hold_s=30.0)
    assert _feed(scorer, 25, {"node1": 0.010, "node2": 0.03, "node3": 0.010}) == []


def test_two_nodes_are_scored_against_each_other_and_scripts_without_sections_not_at_all() -> None:
    two = {0: "node1", 1: "node2"}
    scorer = straggler.Scorer(2.0)
    silent = straggler.Scorer(2.0)
    for t in range(40):
        scorer.add(Beat(0, "node1", t, float(t), 0.01 * t))
        scorer.add(Beat(1, "node2", t, float(t), 0.03 * t))
        silent.add(Beat(0, "node1", t, float(t), 0.0))  # never runtime.compute(): totals 0
        silent.add(Beat(1, "node2", t, float(t), 0.0))
    scores = scorer.scores(two)
    assert round(scores["node2"], 6) == 3.0 and round(scores["node1"], 6) == round(1 / 3, 6)
    assert silent.scores(two) == {}


def test_the_runtimes_heartbeat_line_and_node_file_are_what_the_watchdog_reads(
    tmp_path: Path,
) -> None:
    code = (
        "from clustertrain import runtime\n"
        "for step in (1, 2):\n"
        "    with runtime.compute():\n"
        "        sum(range(100000))\n"
        "    runtime.heartbeat(step, samples=32)\n"
    )
    env = {**os.environ, protocol.ENV_HEARTBEAT_DIR: str(tmp_path), "RANK": "3", "WORLD_SIZE": "4",
           "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "SLURMD_NODENAME": "node7"}  # fmt: skip
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    step, total, samples = (tmp_path / "rank-3").read_text().split()
    assert step == "2" and float(total) > 0 and samples == "64"  # top's samples/s
    watched = Stragglers(2.0, replace=False)
    assert watched.poll(tmp_path, srun_pid=os.getpid()) is False
    assert watched.nodes == {3: "node7"} and watched.scorer.history[3][-1].step == 2


def test_time_forward_counts_the_training_forward_of_the_module_inside_ddp_not_eval(
    tmp_path: Path,
) -> None:
    """A real DDP model (gloo, world of one): its call begins with DDP's broadcast of buffers;
    the hooks time the module inside, in training mode only."""
    code = (
        "import time, torch, torch.distributed as dist\n"
        "from clustertrain import runtime\n"
        "class Slow(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.bn = torch.nn.BatchNorm1d(2)\n"
        "    def forward(self, x):\n"
        "        time.sleep(0.05 if self.training else 1.0); return self.bn(x)\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "net = Slow(); runtime.time_forward(net)\n"
        "ddp = torch.nn.parallel.DistributedDataParallel(net)\n"
        "ddp(torch.ones(4, 2)).sum().backward(); runtime.heartbeat(1)\n"
        "ddp.eval(); ddp(torch.ones(4, 2)); runtime.heartbeat(2)\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, protocol.ENV_HEARTBEAT_DIR: str(tmp_path), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}  # fmt: skip
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    step, total, _ = (tmp_path / "rank-0").read_text().split()
    assert step == "2" and 0.05 <= float(total) < 1.0  # the training forward, not the eval one

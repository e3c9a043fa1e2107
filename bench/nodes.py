"""A job across 2, 4, 8 and 16 nodes of a local cluster of its own (namespace layout).

  python -m bench.nodes [--write bench/RESULTS-nodes.md]

Brings up a private 16-node cluster beside any other (own state folder, ports and subnet),
runs a plain torchrun script (`tests/jobs/where_am_i.py`, one process per node, one CPU each,
gloo) on each size in turn through the CLI, then takes the cluster down. For each size:
submit to the first step (the last rank's process start, i.e. every node's launcher has
started it), the node check's own time as the batch script prints it, and submit to the first
all-reduce done on every rank. With ``--qualify``, the jobs qualify their nodes
(clustertrain.node.qualify) and the node check's time includes it. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clustertrain import localcluster as cluster

ROOT = Path(__file__).resolve().parent.parent
SIZES = (2, 4, 8, 16)
SCRIPT = "tests/jobs/where_am_i.py"


def run_size(nodes: int, env: dict[str, str], qualify: bool = False) -> dict[str, Any]:
    submitted = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", "submit", "--launcher", "torchrun",
         "--script", SCRIPT, "--nodes", str(nodes), "--gpus-per-node", "0",
         "--cpus-per-task", "1", "--no-avoid-bad-nodes",
         *(["--qualify", "--on-flagged", "warn"] * qualify)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:  # a node flagged in a size before is no reason to skip it
        raise SystemExit(f"{nodes} nodes: submit failed: {done.stderr.strip()}")
    job_id = re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]
    followed = subprocess.run(
        [sys.executable, "-m", "clustertrain", "logs", job_id, "--follow"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if followed.returncode != 0:
        raise SystemExit(f"{nodes} nodes: job {job_id} failed:\n{followed.stdout[-2000:]}")
    ranks = [json.loads(m) for m in re.findall(r"where-am-i (\{.*\})", followed.stdout)]
    check = re.search(r"node check passed on \d+ node\(s\) in ([\d.]+) s", followed.stdout)
    assert len(ranks) == nodes and check, followed.stdout[-2000:]
    return {
        "nodes": nodes,
        "first_step_s": max(r["started"] for r in ranks) - submitted,
        "node_check_s": float(check[1]),
        "all_reduce_s": max(r["reduced"] for r in ranks) - submitted,
        "hosts": len({r["hostname"] for r in ranks}),
    }


def table(rows: list[dict[str, Any]], qualify: bool = False) -> str:
    cpus = len(os.sched_getaffinity(0))
    how = " --qualify`; the node check includes the qualification" if qualify else "`"
    lines = [
        f"Local cluster, namespace layout, {cpus} CPU cores shared by all nodes; one process "
        f"per node (gloo); one run each (`python -m bench.nodes{how}).",
        "",
        "| nodes | distinct hosts | submit to first step | node check | submit to first "
        "all-reduce |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']} | {r['hosts']} | {r['first_step_s']:.1f} s | "
            f"{r['node_check_s']:.1f} s | {r['all_reduce_s']:.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--qualify", action="store_true", help="jobs with --qualify")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-nodes-") as work:
        layout = cluster.Layout(
            nodes=max(sizes), cpus_per_node=1, gpus_per_node=0, base_port=17817,
            subnet="10.77.1.0/24", state_dir=Path(work) / "cluster",
        )  # fmt: skip
        conf = cluster.up(layout)
        try:
            env = {**os.environ, "SLURM_CONF": conf, "CLUSTERTRAIN_RUNS_DIR": f"{work}/runs",
                   "XDG_CONFIG_HOME": work}  # fmt: skip
            rows = [run_size(n, env, args.qualify) for n in sizes]
        finally:
            cluster.down(layout.state_dir)
    text = table(rows, args.qualify)
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()

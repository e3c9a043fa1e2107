"""Time to 99.0 % MNIST test accuracy at 1, 2 and 4 processes on the local Slurm cluster.

  python -m bench.scaling [--write bench/RESULTS-scaling.md]

Each world runs `jobs/mnist.yaml` (DDP under torchrun, fast recipe, 2 epochs of the full 60k
set) with `--target-acc 0.99`, one after another through clustertrain's Python API, so every
row pays the same Slurm and start-up costs. The recipe splits its global batch of 128 over
the processes, so every world takes the same steps; the rows differ in how the host's cores
are shared. "time to 99 %" is from the first rank's process start (metrics.jsonl), "submit to
99 %" adds queueing, the node check and srun; "global batch" confirms the split.
Needs `clustertrain cluster up` first.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import clustertrain

ROOT = Path(__file__).resolve().parent.parent
# (nodes, processes per node): 1, 2 and 4 processes in all.
WORLDS = ((1, 1), (2, 1), (2, 2))


def run_world(nodes: int, procs: int, runs_dir: Path) -> dict[str, Any]:
    submitted = time.time()
    job = clustertrain.submit(
        str(ROOT / "jobs" / "mnist.yaml"),
        nodes=nodes,
        gpus_per_node=0,
        procs_per_node=procs,
        extra_args=["--target-acc", "0.99", "--log-every", "1000"],
        runs_dir=str(runs_dir),
    )
    assert isinstance(job, clustertrain.Job)
    state = job.wait(timeout=1800)
    # The example's own closing record (its metrics.jsonl), which holds its phases.
    out = job.run_dir / "out" / "metrics.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done = records[-1] if records else {}
    if state != "COMPLETED" or done.get("event") != "done":
        raise SystemExit(f"job {job.job_id} ({nodes}x{procs}) ended {state}: {job.run_dir}")
    phases = done["phases"]
    reached = done["time_to_target_s"]
    return {
        "world": nodes * procs,
        "layout": f"{nodes} node(s) x {procs}",
        "global_batch": done["global_batch"],
        "epochs": len(records) - 1,
        "test_acc": done["test_acc"],
        "time_s": reached,
        "submit_s": None if reached is None else phases["process_start"] + reached - submitted,
        "images_per_s": records[0]["images_per_s"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    single = rows[0]["time_s"]
    lines = [
        f"Time to 99.0 % test accuracy on the local cluster, {len(os.sched_getaffinity(0))} CPU "
        "cores shared by every node, no GPU (`python -m bench.scaling`):",
        "",
        "| processes | layout | global batch | epochs | final acc. | time to 99 % | vs 1 process "
        "| submit to 99 % | images/s (epoch 1) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["time_s"] is None:
            reached, ratio, submit = "not reached", "-", "-"
        else:
            reached, submit = f"{r['time_s']:.1f} s", f"{r['submit_s']:.1f} s"
            ratio = f"{r['time_s'] / single:.2f}x" if single else "-"
        lines.append(
            f"| {r['world']} | {r['layout']} | {r['global_batch']} | {r['epochs']} | "
            f"{r['test_acc']:.2%} | {reached} | {ratio} | {submit} | {r['images_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_world(n, p, Path(tmp)) for n, p in WORLDS]
    text = table(rows)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

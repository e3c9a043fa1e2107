"""What runtime.heartbeat(step) costs a training step.

    python bench/heartbeat.py [--calls 200000]

Times the call in a loop (its file in a temporary folder, as in a job), beside an empty loop,
and gives the cost per call and its share of two step times: the demo's (2 nodes x 2 ranks,
global batch 128 at about 4,000 images/s: 32 ms) and a fast 1 ms step. Goal: at most 1 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from clustertrain import protocol, runtime

STEPS_S = {"the demo's MNIST step (32 ms)": 0.032, "a 1 ms step": 0.001}


def per_call_s(calls: int, beat: bool) -> float:
    start = time.perf_counter()
    for step in range(calls):
        if beat:
            runtime.heartbeat(step)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    os.environ[protocol.ENV_HEARTBEAT_DIR] = tempfile.mkdtemp(prefix="clustertrain-beats-")
    os.environ.setdefault("RANK", "0")
    costs = [
        per_call_s(args.calls, True) - per_call_s(args.calls, False) for _ in range(args.repeats)
    ]
    cost = statistics.median(costs)
    spread = f"min {min(costs) * 1e6:.2f}, max {max(costs) * 1e6:.2f}"
    print(f"runtime.heartbeat: {cost * 1e6:.2f} us a call (median of {args.repeats} x "
          f"{args.calls:,} calls; {spread})\n")  # fmt: skip
    print("| step | heartbeat's share |")
    print("|---|---:|")
    for name, step_s in STEPS_S.items():
        print(f"| {name} | {100 * cost / step_s:.4f} % |")


if __name__ == "__main__":
    main()

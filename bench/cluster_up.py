"""What Slurm's accounting (slurmdbd on MariaDB) adds to ``clustertrain cluster up``.

    sudo .venv/bin/python bench/cluster_up.py [--runs 3]

Brings a private 2-node cluster (its own state folder, ports and subnet, beside any cluster
that is up) up and down, with accounting and with ``--no-accounting``, turn by turn, and gives
each one's median seconds to idle nodes, the seconds accounting adds, and ``down``'s time.
Packages must be installed already (a first ``cluster up`` does it): apt's time is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from clustertrain import localcluster as cluster


def once(state_dir: Path, accounting: bool) -> tuple[float, float]:
    layout = cluster.Layout(
        nodes=2, cpus_per_node=1, gpus_per_node=2, base_port=19817, subnet="10.77.9.0/24",
        state_dir=state_dir, accounting=accounting,
    )  # fmt: skip
    start = time.monotonic()
    try:
        cluster.up(layout)
        up = time.monotonic() - start
    finally:
        start = time.monotonic()
        cluster.down(state_dir)
    return up, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    found: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-") as tmp:
        for _ in range(args.runs):
            for accounting in (False, True):
                found[accounting].append(once(Path(tmp) / "cluster", accounting))
    for accounting, runs in found.items():
        up = statistics.median(u for u, _ in runs)
        down = statistics.median(d for _, d in runs)
        name = "with accounting" if accounting else "--no-accounting"
        print(f"{name:<16} up {up:5.1f} s  down {down:4.1f} s  (median of {args.runs})")
    added = statistics.median(u for u, _ in found[True]) - statistics.median(
        u for u, _ in found[False]
    )
    print(f"accounting adds {added:.1f} s to up")


if __name__ == "__main__":
    main()

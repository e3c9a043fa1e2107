"""What the rank side's public face costs a rank's start-up.

    python bench/public_face.py [--runs 30]

Starts a fresh Python that imports what a training script imports first (``from clustertrain
import runtime, events``: neither imports torch, which alone takes about 1.7 s here) and, in turn,
one that imports the rank side's modules themselves (``clustertrain.rank.runtime``, ``.events``),
pair by pair, and gives
each one's median wall time and the ratio of each pair: the re-exported names should cost
nothing (goal: a ratio of 1.00, within the machine's noise).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

PUBLIC = "from clustertrain import runtime, events"
REAL = "from clustertrain.rank import runtime, events"


def once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    once(PUBLIC), once(REAL)  # warm the file cache
    pairs = [(once(PUBLIC), once(REAL)) for _ in range(args.runs)]
    public = statistics.median(p for p, _ in pairs)
    real = statistics.median(r for _, r in pairs)
    ratio = statistics.median(p / r for p, r in pairs)
    print(f"{PUBLIC!r}: {public * 1000:.1f} ms (median of {args.runs})")
    print(f"{REAL!r}: {real * 1000:.1f} ms")
    print(f"public / real, pair by pair: {ratio:.3f} (median)")


if __name__ == "__main__":
    main()

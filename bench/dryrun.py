"""How long `clustertrain submit --nodes 4 --gpus-per-node 8 --dry-run` takes, start to exit,
side by side with TorchX's dry run of the same allocation.

    python bench/dryrun.py [--runs 21] [--out bench/RESULTS-dryrun.md]

The runs alternate (ours, TorchX's, ours, ...) so that a drifting machine hurts both alike, and
each ratio is taken pair by pair. TorchX is installed from PyPI into its own virtual environment
(in ~/.cache/clustertrain/bench) the first time. Rows: our dry run as users install it
(``pip install .``, into ~/.cache/clustertrain/bench, run from an empty folder); the same from
this checkout's editable install (./scripts/setup's, whose import hook costs about 10 ms at every
start); TorchX's `torchx run --dryrun -s slurm dist.ddp -j 4x8`; and a bare interpreter. The
ratio is a figure, not a goal: a dry run around 0.1 s is fast enough for a person.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Outside the checkout, so that no tool reading it walks them.
VENVS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "clustertrain", "bench")
TORCHX_VENV = VENVS / "torchx-venv"
INSTALLED_VENV = VENVS / "installed-venv"
OURS = [sys.executable, "-m", "clustertrain", "submit", "--nodes", "4", "--gpus-per-node", "8"]


def torchx() -> list[str]:
    """TorchX's command, installing it into its own environment the first time."""
    exe = TORCHX_VENV / "bin" / "torchx"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TORCHX_VENV)], check=True)
        pip = [str(TORCHX_VENV / "bin" / "pip"), "install", "-q", "torchx==0.7.0"]
        subprocess.run(pip, check=True)
    script = Path(tempfile.gettempdir()) / "clustertrain-bench-train.py"
    script.write_text("print('train')\n")
    return [str(exe), "run", "--dryrun", "-s", "slurm", "dist.ddp", "-j", "4x8", "--script",
            str(script)]  # fmt: skip


def install() -> list[str]:
    """clustertrain as users install it (``pip install .``, no editable import hook), in its
    own environment, afresh from this checkout; it runs from an empty folder so that the
    checkout itself is not imported."""
    pip = [str(INSTALLED_VENV / "bin" / "pip"), "install", "-q"]
    if not (INSTALLED_VENV / "bin" / "pip").exists():
        subprocess.run([sys.executable, "-m", "venv", str(INSTALLED_VENV)], check=True)
        subprocess.run([*pip, str(ROOT)], check=True)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(ROOT)], check=True)
    return [str(INSTALLED_VENV / "bin" / "clustertrain"), *OURS[3:]]


def seconds(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def measure(runs: int) -> dict[str, list[float]]:
    elsewhere = Path(tempfile.mkdtemp(prefix="clustertrain-bench-"))
    installed = install()
    commands = {
        "clustertrain dry run, installed": lambda: seconds(
            [*installed, "--dry-run"], cwd=elsewhere
        ),
        "clustertrain dry run, editable dev install": lambda: seconds([*OURS, "--dry-run"]),
        "torchx run --dryrun -s slurm dist.ddp -j 4x8": lambda: seconds(torchx()),
        "python -c pass (interpreter start)": lambda: seconds([sys.executable, "-c", "pass"]),
    }
    for run in commands.values():  # a warm-up each: caches, TorchX's install
        run()
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, run in commands.items():
            times[name].append(run())
    return times


def table(times: dict[str, list[float]], runs: int) -> str:
    torchx_name = next(name for name in times if name.startswith("torchx"))
    lines = [
        f"median of {runs} runs, alternating; {platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {sys.version.split()[0]}",
        "",
        "| command | median s | min s | max s | TorchX / this, median of pairs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in times.items():
        ratio = statistics.median(t / o for t, o in zip(times[torchx_name], values, strict=True))
        lines.append(
            f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | "
            f"{max(values):.3f} | {ratio:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    text = table(measure(args.runs), args.runs)
    print(text, end="")
    if args.out:
        args.out.write_text("# The dry run beside TorchX's\n\n`python bench/dryrun.py`:\n\n" + text)


if __name__ == "__main__":
    main()

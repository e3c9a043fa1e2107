"""Benchmark the MNIST entrypoint on this machine and print one markdown table.

  python -m bench.train [--data-dir DIR] [--write bench/RESULTS-train.md]

1. images/s of the reference recipe (classic CNN, batch 64, Adadelta), one process: the
   entrypoint's tensor data path vs torchvision's datasets.MNIST + DataLoader + ToTensor/Normalize.
2. Time to 99.0 % test accuracy, full 60k set, one process: --recipe fast vs --recipe reference
   (the entrypoint run as users run it, read from its metrics.jsonl).
3. Peak memory of 1, 2 and 4 DDP ranks on one node (torchrun), one epoch of --recipe fast on the
   full set: the sum over ranks of PSS (shared pages split between the processes that map them,
   so the one memory-mapped copy of the training set counts once) and of RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from jobs.mnist import data as mnist
from jobs.mnist import images, model, recipes

TRAIN = ["-m", "jobs.mnist.train"]
ROOT = Path(__file__).resolve().parent.parent


def throughput(data_dir: Path, steps: int) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    raw = mnist.prepare_mnist(data_dir)
    recipe = recipes.RECIPES["reference"]
    tensor_loader = DataLoader(
        images.Images(*mnist.load_split(raw, train=True)),
        batch_size=64,
        shuffle=True,
        collate_fn=images.whole_batch,
    )
    classic_loader = DataLoader(
        datasets.MNIST(
            root=str(data_dir),
            train=True,
            download=False,
            transform=transforms.Compose(
                [transforms.ToTensor(), transforms.Normalize((mnist.MEAN,), (mnist.STD,))]
            ),
        ),
        batch_size=64,
        shuffle=True,
    )
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    rates = {}
    for name, loader in (("tensors", tensor_loader), ("torchvision", classic_loader)):
        torch.manual_seed(1)
        net = model.build("classic")
        optimizer, _ = recipes.build_training(recipe, recipe.lr, recipe.epochs, net, len(loader))
        batches = iter(loader)
        warmup = 10
        for step in range(warmup + steps):
            if step == warmup:
                start = time.perf_counter()
            x, y = next(batches)
            loss = recipes.loss(recipe, net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        rates[name] = steps * 64 / (time.perf_counter() - start)
    return rates


def time_to_target(data_dir: Path, recipe: str, work: Path) -> dict[str, Any]:
    out = work / recipe
    subprocess.run(
        [
            sys.executable,
            *TRAIN,
            "--recipe",
            recipe,
            "--target-acc",
            "0.99",
            "--no-resume",
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(out),
            "--log-every",
            "1000",
        ],
        check=True,
        cwd=ROOT,
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    done = records[-1]
    return {
        "time_s": done["time_to_target_s"],
        "epochs": len(records) - 1,
        "test_acc": done["test_acc"],
        "images_per_s": records[0]["images_per_s"],
    }


_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")  # the header line of one mapping in smaps


def _memory_kb(pid: int) -> tuple[int, int, int]:
    """PSS and RSS of a process, and the PSS of its mappings of the MNIST raw files."""
    pss = rss = data = 0
    in_data = False
    try:
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            key, _, value = line.partition(":")
            if _MAPPING.match(line):
                in_data = "/MNIST/raw/" in line
            elif key == "Pss":
                pss += int(value.split()[0])
                data += int(value.split()[0]) if in_data else 0
            elif key == "Rss":
                rss += int(value.split()[0])
    except (OSError, ValueError):
        return 0, 0, 0
    return pss, rss, data


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def peak_memory(data_dir: Path, ranks: int, work: Path) -> dict[str, float]:
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = subprocess.Popen(
        [
            str(torchrun),
            "--standalone",
            f"--nproc-per-node={ranks}",
            *TRAIN,
            "--strategy",
            "ddp",
            "--recipe",
            "fast",
            "--epochs",
            "1",
            "--no-resume",
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(work / f"mem{ranks}"),
            "--log-every",
            "1000",
        ],
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    peak = {"pss": 0, "rss": 0, "data": 0}

    def sample() -> None:
        while launcher.poll() is None:
            usage = [_memory_kb(pid) for pid in _children(launcher.pid)]  # the ranks
            for index, key in enumerate(peak):
                peak[key] = max(peak[key], sum(u[index] for u in usage))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    if launcher.wait() != 0:
        raise SystemExit(f"torchrun with {ranks} ranks failed")
    sampler.join()
    return {k: v / 1024 for k, v in peak.items()}


PARTS = ("memory", "throughput", "target")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=mnist.default_data_dir())
    parser.add_argument("--steps", type=int, default=150, help="timed steps per data path")
    parser.add_argument("--parts", default=",".join(PARTS), help="default: %(default)s")
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    parts = args.parts.split(",")
    mnist.prepare_mnist(args.data_dir)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "throughput" in parts:
            rates = throughput(args.data_dir, args.steps)
            rows += [
                ("reference recipe, images/s, tensor data path", f"{rates['tensors']:,.0f}"),
                (
                    "reference recipe, images/s, torchvision datasets.MNIST + DataLoader",
                    f"{rates['torchvision']:,.0f}",
                ),
            ]
        if "target" in parts:
            fast = time_to_target(args.data_dir, "fast", work)
            reference = time_to_target(args.data_dir, "reference", work)
            rows += [
                ("time to 99.0 % test acc., --recipe fast", _seconds(fast)),
                ("time to 99.0 % test acc., --recipe reference", _seconds(reference)),
            ]
            if fast["time_s"] and reference["time_s"]:
                ratio = reference["time_s"] / fast["time_s"]
                rows.append(("fast vs reference, time to 99.0 %", f"{ratio:.1f}x sooner"))
        if "memory" in parts:
            for ranks in (1, 2, 4):
                peak = peak_memory(args.data_dir, ranks, work)
                rows.append(
                    (
                        f"peak memory, {ranks} DDP rank(s) on one node: all ranks (PSS / RSS); "
                        "MNIST files mapped (PSS)",
                        f"{peak['pss']:,.0f} / {peak['rss']:,.0f} MiB; {peak['data']:,.1f} MiB",
                    )
                )
    cpus = len(os.sched_getaffinity(0))
    table = "\n".join(
        [
            f"MNIST entrypoint, one process unless said, {cpus} CPU cores, no GPU "
            "(`python -m bench.train`):",
            "",
            "| measure | value |",
            "|---|---|",
        ]
        + [f"| {name} | {value} |" for name, value in rows]
    )
    print(table)
    if args.write:
        args.write.write_text(table + "\n")
    return 0


def _seconds(run: dict[str, Any]) -> str:
    if run["time_s"] is None:
        return f"not reached ({run['test_acc']:.2%})"
    return f"{run['time_s']:.1f} s ({run['epochs']} epoch(s), {run['test_acc']:.2%})"


if __name__ == "__main__":
    sys.exit(main())

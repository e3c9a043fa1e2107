"""The command line of the MNIST job and the settings it yields."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from clustertrain import env as dist_env

from . import data
from .recipes import RECIPES, Recipe

USAGE = """Examples:
  python -m jobs.mnist.train --recipe fast --out-dir out
  torchrun --standalone --nproc-per-node 2 -m jobs.mnist.train --strategy ddp
  accelerate launch --multi_gpu --num_processes 2 -m jobs.mnist.train --strategy accelerate
In a notebook:
  from jobs.mnist import train
  notebook_launcher(train.train, (train.parse_args(["--strategy", "accelerate"]),),
                    num_processes=2)
"""


@dataclass(frozen=True)
class Config:
    strategy: str = "single"
    recipe: str = "reference"
    epochs: int = 14
    batch_size: int | None = None  # per process; None: the recipe's global batch, split
    lr: float | None = None  # None: the recipe's, scaled to the global batch
    seed: int = 1
    target_acc: float | None = None
    limit_train: int | None = None
    data_dir: Path = data.default_data_dir()
    out_dir: Path = Path("out")
    resume: bool = True
    log_every: int = 100

    @property
    def plan(self) -> Recipe:
        return RECIPES[self.recipe]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> Config:
    parser = _Parser(
        description="Train MNIST with plain PyTorch, DDP or Accelerate; the same code on one "
        "CPU or many nodes.",
        epilog=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--strategy",
        choices=["single", "ddp", "accelerate"],
        help="default: ddp when a launcher started several processes, else single",
    )
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="reference")
    parser.add_argument("--epochs", type=_positive(int), help="default: the recipe's")
    parser.add_argument(
        "--batch-size",
        type=_positive(int),
        help="per process (default: the recipe's global batch divided among the processes)",
    )
    parser.add_argument(
        "--lr", type=_positive(float), help="peak learning rate (default: the recipe's, scaled)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--target-acc", type=_fraction, help="stop once the test accuracy (0..1) reaches it"
    )
    parser.add_argument(
        "--limit-train", type=_positive(int), metavar="N", help="train on the first N images only"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data.default_data_dir(),
        help="default: $CLUSTERTRAIN_DATA_DIR or ~/.cache/clustertrain/mnist",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("CLUSTERTRAIN_OUT_DIR", "out")),
        help="default: $CLUSTERTRAIN_OUT_DIR (set in clustertrain jobs) or ./out",
    )
    parser.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue from the newest checkpoint in --out-dir (default)",
    )
    parser.add_argument(
        "--log-every",
        type=_positive(int),
        default=100,
        metavar="N",
        help="steps between progress lines when stderr is not a terminal",
    )
    args = vars(parser.parse_args(argv))
    if args["strategy"] is None:
        args["strategy"] = "ddp" if dist_env.from_environ().world_size > 1 else "single"
    if args["epochs"] is None:
        args["epochs"] = RECIPES[args["recipe"]].epochs
    return Config(**args)


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"is a fraction in (0, 1], got {text} (99 %% is 0.99)")
    return value

"""Train MNIST with plain PyTorch, DDP or Accelerate; the same code on one CPU or many nodes.

  python -m jobs.mnist.train --recipe fast --out-dir out
  torchrun --standalone --nproc-per-node 2 -m jobs.mnist.train --strategy ddp
  accelerate launch --multi_gpu --num_processes 2 -m jobs.mnist.train --strategy accelerate

In a notebook::

  from accelerate import notebook_launcher
  from jobs.mnist import train
  notebook_launcher(train.train, (train.parse_args(["--strategy", "accelerate"]),), num_processes=2)

and on the nodes of a cluster, ``clustertrain.notebook_launcher`` (docs/notebooks/mnist.ipynb).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO, Any

if not __package__:  # `python jobs/mnist/train.py`: the package's relative imports would fail
    sys.exit("error: run it as a module from the repository root: python -m jobs.mnist.train")

from clustertrain import env as dist_env  # noqa: E402
from clustertrain import protocol, runtime  # noqa: E402
from clustertrain.errors import UserError  # noqa: E402

from . import data, strategies  # noqa: E402
from .config import Config, parse_args  # noqa: E402
from .loop import Trainer  # noqa: E402

__all__ = ["Config", "main", "parse_args", "train"]


def train(config: Config, started_at: float | None = None) -> dict[str, Any]:
    """Train as ``config`` says; returns the final metrics record (the same on every rank)."""
    phases = {"process_start": started_at if started_at is not None else time.time()}
    launched = dist_env.from_environ()
    saved_streams = sys.stdout, sys.stderr
    # torchrun and accelerate already prefix each line when clustertrain's job sets this.
    if launched.rank != 0 and protocol.ENV_RANK_PREFIX not in os.environ:
        sys.stdout = _RankPrefixed(sys.stdout, launched.rank)  # type: ignore[assignment]
        sys.stderr = _RankPrefixed(sys.stderr, launched.rank)  # type: ignore[assignment]
    # Before the rendezvous: missing data ends every rank at once, with no peer left waiting.
    raw = data.require_mnist(config.data_dir)
    stop = runtime.StopRequest.install()
    try:
        strategy = strategies.start(config.strategy, launched)
        strategy.stop = stop
        phases["process_group_ready"] = time.time()
        runtime.milestone("rendezvous", phases["process_group_ready"] - phases["process_start"])
        # One line from every rank, so a job's log shows where each one landed.
        print(
            f"rank {strategy.rank}/{strategy.world_size} (local {strategy.local_rank}) on "
            f"{os.environ.get('SLURMD_NODENAME') or os.uname().nodename}: {strategy.device}",
            flush=True,
        )
        result = Trainer(config, strategy, phases, raw).run()
        strategy.teardown()
        return result
    finally:
        stop.uninstall()
        sys.stdout, sys.stderr = saved_streams
        # After a failure, without the barrier: the peers may be gone.
        dist_env.destroy_process_group()


class _RankPrefixed:
    """A text stream that starts every line with ``[rank N] ``."""

    def __init__(self, stream: IO[str], rank: int) -> None:
        self._stream, self._prefix, self._at_line_start = stream, f"[rank {rank}] ", True

    def write(self, text: str) -> int:
        out = []
        for line in text.splitlines(keepends=True):
            out.append(self._prefix + line if self._at_line_start else line)
            self._at_line_start = line.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _process_start() -> float:
    """When this process started (Linux), so the phase times include interpreter and imports."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK")


# How long a rank other than 0 waits, after finding the data missing, for its launcher to end it.
_RANK_0_SPEAKS_S = 30


def _leave_it_to_rank_0() -> None:
    """Every rank reads the same data folder, so rank 0 says what is wrong, once. The others
    wait to be ended (rank 0's failure ends the job's step): leaving first would make the
    launcher stop rank 0 before it spoke. A rank still here after the wait says it itself
    (its node's folder may be the odd one out)."""
    time.sleep(_RANK_0_SPEAKS_S)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        train(config, started_at=_process_start())
    except UserError as exc:
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        if isinstance(exc, data.DataError) and rank != "0":
            _leave_it_to_rank_0()
        prefix = "" if rank == "0" else f"[rank {rank}] "
        print(f"{prefix}error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    runtime.finish(main())

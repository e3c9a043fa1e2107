"""Checkpoints that survive a kill at any moment, and the per-rank state they carry.

A checkpoint is taken at the end of every epoch (``epoch-0003.pt``) and, when the job is asked
to stop, in the middle of one (``epoch-0003-step-000041.pt``: 41 steps of epoch 3 done).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"epoch-(\d+)(?:-step-(\d+))?\.pt")
KEEP = 2


class Store:
    """``DIR/epoch-NNNN[-step-SSSSSS].pt`` files. A new one is complete and durable (temporary
    file, fsync, rename, fsync of the folder) before older ones are deleted, so a kill during a
    write leaves at worst a stray temporary file next to the previous, loadable checkpoint."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _positions(self) -> list[tuple[tuple[int, float], Path]]:
        """Checkpoints, newest first: a mid-epoch one sorts between its epoch's neighbours."""
        if not self.directory.is_dir():
            return []
        found = [
            ((int(m[1]), int(m[2]) if m[2] else float("inf")), p)
            for p in self.directory.iterdir()
            if (m := _NAME.fullmatch(p.name))
        ]
        return sorted(found, reverse=True)

    def save(self, epoch: int, state: dict[str, Any], step: int | None = None) -> Path:
        """Write ``state`` as epoch ``epoch``'s checkpoint, or after ``step`` steps of it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch:04d}" + (f"-step-{step:06d}" if step is not None else "")
        final = self.directory / f"{name}.pt"
        tmp = self.directory / f".{final.name}.tmp"
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        for _, old in self._positions()[KEEP:]:
            old.unlink(missing_ok=True)
        return final

    def load_newest(self, log: Callable[[str], None]) -> dict[str, Any] | None:
        for _, path in self._positions():
            try:
                return torch.load(path, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]
            except Exception as exc:  # noqa: BLE001 - any unreadable file: fall back to an older one
                log(f"warning: skipping unreadable checkpoint {path}: {exc}")
        return None

    def clear(self) -> None:
        for _, path in self._positions():
            path.unlink()
        for stray in self.directory.glob(".epoch-*.pt.tmp"):
            stray.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather(mine: dict[str, Any], distributed: bool, world_size: int) -> list[dict[str, Any]]:
    """Every rank's ``mine`` (RNG states, running sums: they differ per rank), indexed by rank."""
    if not distributed:
        return [mine]
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, mine)
    return states

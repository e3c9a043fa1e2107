"""Per-epoch checkpoints that survive a kill at any moment, and the RNG states they carry."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"epoch-(\d+)\.pt")
KEEP = 2


class Store:
    """``DIR/epoch-NNNN.pt`` files. A new one is complete and durable (temporary file, fsync,
    rename, fsync of the folder) before older ones are deleted, so a kill during a write
    leaves at worst a stray temporary file next to the previous, loadable checkpoint."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _epochs(self) -> list[tuple[int, Path]]:
        if not self.directory.is_dir():
            return []
        found = [(int(m[1]), p) for p in self.directory.iterdir() if (m := _NAME.fullmatch(p.name))]
        return sorted(found, reverse=True)

    def save(self, epoch: int, state: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"epoch-{epoch:04d}.pt"
        tmp = self.directory / f".{final.name}.tmp"
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        for _, old in self._epochs()[KEEP:]:
            old.unlink(missing_ok=True)
        return final

    def load_newest(self, log: Callable[[str], None]) -> dict[str, Any] | None:
        for _, path in self._epochs():
            try:
                return torch.load(path, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]
            except Exception as exc:  # noqa: BLE001 - any unreadable file: fall back to an older one
                log(f"warning: skipping unreadable checkpoint {path}: {exc}")
        return None

    def clear(self) -> None:
        for _, path in self._epochs():
            path.unlink()
        for stray in self.directory.glob(".epoch-*.pt.tmp"):
            stray.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def gather_rng(distributed: bool, world_size: int) -> list[dict[str, Any]]:
    """Every rank's RNG state (dropout masks differ per rank), indexed by rank."""
    mine = _rng_state()
    if not distributed:
        return [mine]
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, mine)
    return states


def restore_rng(states: list[dict[str, Any]], rank: int) -> None:
    state = states[rank]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

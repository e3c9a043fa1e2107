"""Checkpoints that survive a kill at any moment, and the per-rank state they carry: plain
PyTorch (:class:`Store`) and Accelerate's ``save_state`` folders.

A checkpoint is taken at the end of every epoch (``epoch-0003.pt``) and, when the job is asked
to stop, in the middle of one (``epoch-0003-step-000041.pt``: 41 steps of epoch 3 done).
"""

from __future__ import annotations

import os
import re
import shutil
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


# Accelerate's flavour: ``accelerator.save_state`` writes a folder (model, optimizer, RNG states
# of every process). Written under a temporary name and renamed, so a kill mid-write leaves
# the previous folder as the newest complete one.
_STATE = re.compile(r"state-(\d{9})")


def save_accelerator_state(accelerator: Any, directory: Path, step: int) -> Path:
    """``accelerator.save_state`` into ``DIR/state-<step>``, atomically; call on every rank."""
    final = directory / f"state-{step:09d}"
    tmp = directory / f".state-{step:09d}.tmp"
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for path in tmp.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
        for old in sorted(_accelerator_states(directory), reverse=True)[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def latest_accelerator_state(directory: Path) -> tuple[Path, int] | None:
    """The newest complete ``state-<step>`` folder and its step, or None."""
    states = sorted(_accelerator_states(directory), reverse=True)
    return (states[0], int(states[0].name.split("-")[1])) if states else None


def _accelerator_states(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if _STATE.fullmatch(p.name) and p.is_dir()]

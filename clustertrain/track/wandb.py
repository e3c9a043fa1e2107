"""W&B: a job with ``offline: true`` runs W&B offline (WANDB_MODE=offline), into the run folder
(WANDB_DIR: ``<run folder>/wandb/offline-run-*``); once the job ended, the relay syncs each
such run with W&B's own ``wandb sync <folder>``, once (the position keeps which), from a
machine with a route out. What the script logged through ``wandb`` is what W&B gets: the
offline run is already a W&B run, so the relay sends no points of its own.

An offline run's folder is read by ``wandb sync``, which uploads what it finds: a folder that
is a symlink, or that holds one leading outside the run folder, is refused (a run folder is
anyone's to write; a planted link would upload another file of yours)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import printable
from clustertrain.runs import Run
from clustertrain.track.base import Point, Tracker, Unreachable

# What `wandb offline` names a run's folder: offline-run-<date>_<time>-<run id>.
OFFLINE_RUN = re.compile(r"offline-run-[0-9]{8}_[0-9]{6}-[A-Za-z0-9]{1,64}")
# How many entries of an offline run are checked for links before it is refused as too big.
MAX_ENTRIES = 100_000
SYNC_TIMEOUT_S = 600.0
# W&B's own debug logs, which it links into ~/.cache/wandb and `wandb sync` does not upload.
LOGS = "logs"


class WandB(Tracker):
    name = "wandb"

    def __init__(self, run: Run, uri: str | None, say: Callable[[str], None]) -> None:
        super().__init__()
        self.run, self.uri, self.say = run, uri, say

    def open(self, kept: Mapping[str, Any]) -> None:
        synced = kept.get("synced")
        names = synced if isinstance(synced, list) else []
        self.kept = {"synced": [n for n in names if isinstance(n, str)]}

    def params(self, values: Mapping[str, str]) -> None:
        """Nothing: the offline run holds the script's own config."""

    def points(self, points: Sequence[Point]) -> None:
        """Nothing: the offline run holds what the script logged."""

    def tags(self, values: Mapping[str, str]) -> None:
        """Nothing: W&B's run is the script's own."""

    def finish(self, state: str, files: Sequence[Path]) -> None:
        """``wandb sync`` each offline run not synced yet, after the job (a run still being
        written would be synced half)."""
        found = offline_runs(self.run, self.say)
        if not found:
            self.say(f"wandb: no offline run in {self.run.path / protocol.WANDB_DIR}")
        for folder in found:
            if folder.name in self.kept["synced"]:
                continue
            self._sync(folder)
            self.kept["synced"].append(folder.name)
            self.say(f"wandb: synced {folder}")

    def _sync(self, folder: Path) -> None:
        command = shutil.which("wandb")
        if command is None:
            raise UserError("wandb: no `wandb` command; pip install 'clustertrain[wandb]'")
        env = {**os.environ, **({"WANDB_BASE_URL": self.uri} if self.uri else {})}
        env.pop("WANDB_MODE", None)  # an offline shell would make the sync a no-op
        try:
            done = subprocess.run(
                [command, "sync", str(folder)],
                env=env,
                capture_output=True,
                text=True,
                timeout=SYNC_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise Unreachable(f"wandb sync {folder}: no answer in {SYNC_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()
            why = printable(last[-1])[:200] if last else f"exit status {done.returncode}"
            raise Unreachable(f"wandb sync {folder} failed: {why}")


def offline_runs(run: Run, say: Callable[[str], None]) -> list[Path]:
    """The offline runs in the run folder's ``wandb/``, oldest first; a link, or a folder that
    holds a link leading outside the run folder, is said and left out."""
    root = run.path / protocol.WANDB_DIR
    if root.is_symlink():
        say(f"wandb: {root} is a symlink; nothing in it is synced")
        return []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    inside = run.folder.resolve()
    for entry in entries:
        if not OFFLINE_RUN.fullmatch(entry.name):
            continue  # wandb's own `latest-run` link, debug logs
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            say(f"wandb: {printable(entry.path)} is a link or no folder; not synced")
        elif escape := _link_outside(Path(entry.path), inside):
            say(f"wandb: {printable(entry.path)} holds {printable(escape)}, a link out of the "
                "run folder; not synced")  # fmt: skip
        else:
            found.append(Path(entry.path))
    return found


def _link_outside(folder: Path, inside: Path) -> str | None:
    """The first link below ``folder`` (but in W&B's :data:`LOGS`) that leads outside
    ``inside``; too many entries to check count as one."""
    seen = 0
    for parent, dirs, files in os.walk(folder):
        if Path(parent) == folder and LOGS in dirs:
            dirs.remove(LOGS)
        for name in dirs + files:
            seen += 1
            path = Path(parent, name)
            if seen > MAX_ENTRIES:
                return f"more than {MAX_ENTRIES} entries"
            if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(inside):
                return str(path)
    return None

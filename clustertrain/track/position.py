"""Where a relay to one tracker stands, kept in the run folder (``track/<tracker>.json``): the
offset in ``events.jsonl`` up to which every whole line was sent, the counters those lines
added up to, whether the params and the end were sent, and what the tracker itself keeps
(its run's id). Written after each batch a tracker took, by a rename: a relay stopped at any
moment and started again sends nothing twice and misses nothing."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, read_regular
from clustertrain.runs import Run
from clustertrain.track.records import Progress

FOLDER = "track"
MAX_BYTES = 1 << 20


@dataclass
class Position:
    offset: int = 0
    progress: Progress = field(default_factory=Progress)
    params: bool = False  # the job's fields were sent
    done: bool = False  # the end (files, final state) was sent
    kept: dict[str, Any] = field(default_factory=dict)  # the tracker's own (Tracker.kept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "progress": self.progress.to_dict(),
            "params": self.params,
            "done": self.done,
            "kept": self.kept,
        }


def path(run: Run, tracker: str) -> Path:
    return run.path / FOLDER / f"{tracker}.json"


def load(run: Run, tracker: str) -> Position:
    """The position kept for ``tracker``, or the start; a file that is no position (forged,
    cut) is refused rather than taken for the start, which would send everything again."""
    where = path(run, tracker)
    if not where.exists() and not where.is_symlink():
        return Position()
    try:
        raw = parse_json(read_regular(where, MAX_BYTES, within=run.folder), str(where))
    except RunFolderError as exc:
        raise UserError(f"{exc}; remove it to send everything again") from None
    offset, kept = raw.get("offset") if isinstance(raw, dict) else None, None
    if isinstance(raw, dict) and isinstance(raw.get("kept"), dict):
        kept = raw["kept"]
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or kept is None:
        raise UserError(f"{where}: not a relay's position; remove it to send everything again")
    progress = raw.get("progress")
    return Position(
        offset=offset,
        progress=Progress.from_dict(progress if isinstance(progress, dict) else {}),
        params=raw.get("params") is True,
        done=raw.get("done") is True,
        kept=kept,
    )


def save(run: Run, tracker: str, position: Position) -> None:
    """Write ``position`` whole or not at all: a new file beside, renamed over the old one (a
    symlink planted at the name is replaced, never written through)."""
    folder = run.path / FOLDER
    if folder.is_symlink():
        raise UserError(f"{folder}: a symlink, not the relay's folder; it is not written to")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=f".{tracker}.", suffix=".partial", dir=folder)
    except OSError as exc:  # a teammate's run folder, which a shared runs root lets you read
        raise UserError(
            f"{folder}: cannot keep what was sent there ({exc.strerror}); relay only jobs "
            "whose run folder you can write"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(position.to_dict(), handle)
        os.replace(partial, path(run, tracker))
    finally:
        Path(partial).unlink(missing_ok=True)

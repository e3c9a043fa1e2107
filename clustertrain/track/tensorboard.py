"""TensorBoard: event files written by TensorBoard's own writer (``EventFileWriter``: what
``torch.utils.tensorboard.SummaryWriter`` writes through), read back by TensorBoard as any
other. Every metric a scalar at its step; the job's fields and tags a text (a Markdown
table); the plot an image. A relay writes into ``<logdir>/<run folder's name>``, the
TensorBoard run of this job, whichever attempt or relay wrote it; without ``--logdir``, into
the run folder's ``tensorboard/`` (where the batch script's $CLUSTERTRAIN_TENSORBOARD_DIR
points, for a script that writes its own), under ``relay``."""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import printable
from clustertrain.runs import Run
from clustertrain.track.base import Point, Tracker

RELAY_DIR = "relay"
# A PNG's width and height, big-endian, in its IHDR chunk (the PNG spec, 11.2.2).
_PNG = b"\x89PNG\r\n\x1a\n"


class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, run: Run, logdir: Path | None) -> None:
        super().__init__()
        self.run = run
        self.folder = (
            logdir.absolute() / run.path.name
            if logdir is not None
            else run.path / protocol.TENSORBOARD_DIR / RELAY_DIR
        )
        self.writer: EventFileWriter | None = None
        self.step = 0

    def _write(self, step: int, when: float, values: list[summary_pb2.Summary.Value]) -> None:
        """One event; the file is made at the first (a relay with nothing new makes none)."""
        if self.writer is None:
            for part in (self.folder.parent, self.folder):
                if part.is_symlink():
                    raise UserError(f"{part}: a symlink; TensorBoard's files are not written there")
            self.folder.mkdir(parents=True, exist_ok=True)
            self.writer = EventFileWriter(str(self.folder), flush_secs=5)
        summary = summary_pb2.Summary(value=values)
        self.writer.add_event(event_pb2.Event(wall_time=when, step=step, summary=summary))

    def open(self, kept: Mapping[str, Any]) -> None:
        self.kept = {"logdir": str(self.folder)}

    def params(self, values: Mapping[str, str]) -> None:
        self._write(0, time.time(), list(text_pb("clustertrain/params", _table(values)).value))

    def points(self, points: Sequence[Point]) -> None:
        for point in points:
            value = summary_pb2.Summary.Value(tag=point.name, simple_value=point.value)
            self._write(point.step, point.time, [value])
            self.step = max(self.step, point.step)
        if self.writer is not None:
            self.writer.flush()  # live: TensorBoard shows each batch as it is relayed

    def tags(self, values: Mapping[str, str]) -> None:
        summary = text_pb("clustertrain/tags", _table(values))
        self._write(self.step, time.time(), list(summary.value))

    def finish(self, state: str, files: Sequence[Path]) -> None:
        for path in files:
            data = path.read_bytes()
            if data[:8] == _PNG and len(data) >= 24:
                width, height = struct.unpack(">II", data[16:24])
                image = summary_pb2.Summary.Image(
                    height=height, width=width, colorspace=4, encoded_image_string=data
                )
                self._write(self.step, time.time(), [_image(path.name, image)])
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _image(name: str, image: summary_pb2.Summary.Image) -> summary_pb2.Summary.Value:
    return summary_pb2.Summary.Value(tag=f"clustertrain/{name}", image=image)


def _table(values: Mapping[str, str]) -> str:
    """A Markdown table, as TensorBoard's text plugin draws one; '|' in a value escaped."""
    bar = "|"
    rows = [
        f"| {printable(k)} | {printable(v).replace(bar, '&#124;')} |" for k, v in values.items()
    ]
    return "\n".join(["| name | value |", "|---|---|", *rows])

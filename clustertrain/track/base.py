"""The one interface every tracker fills (TorchX's ``torchx/tracker/api.py``): what a run's
records say in, what a tracker receives out. The relay (:mod:`clustertrain.track.relay`)
calls these in order, and keeps its position only after a call returned: a call that raised
is made again with the same records, so a tracker sees each record once, unless it died
between taking a batch and the position being written."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class Point:
    """One value a ``log_metrics`` call (or the relay's count of restarts and requeues) gave
    at a step; ``time`` is when the rank recorded it (seconds since the epoch)."""

    name: str
    value: float
    step: int
    time: float


class Unreachable(Exception):
    """The tracker could not be reached (a server down, a network cut): the relay retries the
    same records later, with a bounded backoff, and loses nothing."""


class Tracker(ABC):
    """One tracker. ``kept`` is what it keeps in the relay's position (its own run's id, the
    offline runs it synced), saved after each call that returned: every later call, and every
    later relay, goes to that same run, so a requeued job's attempts land in one tracker run."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    @abstractmethod
    def open(self, kept: Mapping[str, Any]) -> None:
        """Find or make this job's run, from what an earlier relay ``kept``."""

    @abstractmethod
    def params(self, values: Mapping[str, str]) -> None:
        """The job's fields, once."""

    @abstractmethod
    def points(self, points: Sequence[Point]) -> None:
        """Metric values at their steps, in the order the ranks recorded them."""

    @abstractmethod
    def tags(self, values: Mapping[str, str]) -> None:
        """Job id, nodes, attempts, state: sent again whenever they change."""

    @abstractmethod
    def finish(self, state: str, files: Sequence[Path]) -> None:
        """Once the job ended: its files (the plot, the job file) and its final state."""

    def close(self) -> None:  # noqa: B027 (a hook: most trackers hold nothing open)
        """Flush and let go (the relay calls it whatever happened)."""

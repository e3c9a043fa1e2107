"""The relay: a run folder's records, sent to one tracker from where the last relay stopped.

It reads what every other reader reads (``events.jsonl``, through
:func:`clustertrain.rank.events.scan_from`; ``spec.yaml``; the plot), on a machine that
reaches the tracker (the login node, a laptop with the run folder), while the job's nodes
need no route out. The job never waits on it: the ranks append to their events file whether
a relay runs or not, and a relay that cannot reach its tracker keeps its position and tries
again later, with a backoff of 1 s doubling to 30 s.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, read_regular
from clustertrain.rank import events
from clustertrain.runs import Run
from clustertrain.track import position, records
from clustertrain.track.base import Tracker, Unreachable

Say = Callable[[str], None]
# How often a follower asks the scheduler whether the job ended (the events say so sooner,
# through the supervisor's `ended`; this is for a job killed before it could write it).
ASK_EVERY_S = 5.0
MAX_BACKOFF_S = 30.0
MAX_SPEC_BYTES = 1 << 20
# How long `logs --follow` waits, once the job ended, for its relays to send the end.
JOIN_S = 60.0


@dataclass
class Summary:
    """What one relay did: points sent, records skipped, the end sent (its state) or not."""

    sent: int = 0
    skipped: int = 0
    state: str | None = None
    files: list[Path] = field(default_factory=list)


class _Pass:
    """The relay's state between passes: the position, loaded once and saved after each call
    the tracker returned from."""

    def __init__(self, run: Run, tracker: Tracker, say: Say) -> None:
        self.run, self.tracker, self.say = run, tracker, say
        self.at = position.load(run, tracker.name)
        self.summary = Summary(skipped=self.at.progress.skipped)
        self.opened = False
        self.said: set[str] = set()
        self.tagged: dict[str, str] = {}

    def save(self) -> None:
        self.at.kept = dict(self.tracker.kept)
        position.save(self.run, self.tracker.name, self.at)

    def once(self, said_state: str | None) -> bool:
        """Send what is new; True once the end was sent (now or by an earlier relay)."""
        if not self.opened:
            self.tracker.open(self.at.kept)
            self.opened = True
            self.save()
        if not self.at.params:
            self.tracker.params(records.params(job_fields(self.run)))
            self.at.params = True
            self.save()
        while self._read():
            pass
        progress = self.at.progress
        ended = progress.ended is not None or said_state is not None
        state = records.final_state(progress, said_state) if ended else "RUNNING"
        tags = records.tags(self.run.job_id, self.run.name, progress, state)
        if tags != self.tagged:
            self.tracker.tags(tags)
            self.tagged = tags
        if ended and not self.at.done:
            files = _files(self.run, self.say)
            self.tracker.finish(state, files)
            self.at.done = True
            self.save()
            self.summary.state, self.summary.files = state, files
        return self.at.done

    def _read(self) -> bool:
        """One chunk of new events sent; False when there was none."""
        chunk = events.scan_from(self.run.events_path, self.at.offset, within=self.run.folder)
        if chunk.shrunk:
            self._once(
                "shrunk",
                f"{self.run.events_path}: shorter than the {self.at.offset} bytes already "
                "sent (cut or replaced); nothing is sent again",
            )
        if chunk.offset == self.at.offset:
            return False
        low, high = self.run.window()
        found = [e for e in chunk.found if low <= e.time <= high]
        progress = copy.copy(self.at.progress)
        progress.skipped += chunk.dropped + len(chunk.found) - len(found)
        points = records.points(found, progress)
        if points:
            self.tracker.points(points)
        self.at.offset, self.at.progress = chunk.offset, progress
        self.save()
        self.summary.sent += len(points)
        if progress.skipped > self.summary.skipped:
            self.summary.skipped = progress.skipped
            self._once(
                "skipped",
                f"{self.run.events_path}: record(s) skipped: not an event, a value that is not "
                "a finite number, or a time outside the job's own window (the count is in "
                "the summary)",
            )
        return True

    def _once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            self.say(line)


def job_fields(run: Run) -> dict[str, object]:
    """The job's fields as its run folder recorded them (spec.yaml); none where it cannot be
    read (a run folder is anyone's)."""
    import yaml  # lazy: start-up time (4 ms)

    try:
        data = read_regular(run.path / protocol.SPEC_FILE, MAX_SPEC_BYTES, within=run.folder)
        fields = yaml.safe_load(data)
    except (RunFolderError, yaml.YAMLError):
        return {}
    return fields if isinstance(fields, dict) else {}


def _files(run: Run, say: Say) -> list[Path]:
    """What is sent at the end: the job's picture (drawn now, as `plot` draws it) and the
    job file it ran as."""
    found = [run.path / protocol.SPEC_FILE] if (run.path / protocol.SPEC_FILE).is_file() else []
    try:
        from clustertrain.runs import plot  # lazy: matplotlib, the plot extra
    except ImportError:
        say("no plot sent: it needs matplotlib (pip install 'clustertrain[plot]')")
        return found
    try:
        return [plot.draw(run, run.path / "plot.png"), *found]
    except (OSError, UserError) as exc:
        say(f"no plot sent: {exc}")
        return found


def relay(
    run: Run,
    tracker: Tracker,
    say: Say,
    follow: bool = False,
    state: Callable[[], str | None] = lambda: None,
    poll_s: float = 1.0,
    tries: int = 4,
    sleep: Callable[[float], None] = time.sleep,
) -> Summary:
    """Send ``run``'s new records to ``tracker``; with ``follow``, again every ``poll_s`` until
    the job ended and its end was sent. ``state``: the job's final state in the scheduler's
    words once it ended, else None. A tracker that cannot be reached is said once and tried
    again (1 s doubling to 30 s): while the job runs, for as long as it runs; after, ``tries``
    times, then a :class:`UserError` (nothing was lost: the next relay resends from the
    position)."""
    current = _Pass(run, tracker, say)
    failures, asked_at, said = 0, -ASK_EVERY_S, None
    try:
        while True:
            if time.monotonic() - asked_at >= ASK_EVERY_S:
                said, asked_at = state(), time.monotonic()
            try:
                done = current.once(said)
            except Unreachable as exc:
                failures += 1
                if failures == 1:
                    say(f"{tracker.name}: {exc}; trying again (nothing is lost)")
                if failures >= tries and (not follow or said is not None):
                    raise UserError(
                        f"{tracker.name}: {exc}; nothing was lost: run `clustertrain track` "
                        "again once it is reachable"
                    ) from None
                sleep(min(2.0 ** (failures - 1), MAX_BACKOFF_S))
                continue
            failures = 0
            if done or not follow:
                return current.summary
            sleep(poll_s)
    finally:
        tracker.close()


@contextmanager
def alongside(relays: Sequence[Callable[[], object]], say: Say) -> Iterator[None]:
    """Each of ``relays`` (a relay that follows the job) in a thread of its own while the body
    runs (``logs --follow``); one that fails is said in a line and the body goes on. Once the
    body is done, each is given :data:`JOIN_S` to send the end; after an interruption, none
    (they are daemons: what they sent is kept, the next relay sends the rest)."""

    def run(relay: Callable[[], object]) -> None:
        try:
            relay()
        except UserError as exc:
            say(f"track: {exc}")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in relays]
    for thread in threads:
        thread.start()
    yield
    for thread in threads:
        thread.join(JOIN_S)

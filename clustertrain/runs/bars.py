"""A rank's lines as it wrote them, and its progress bars read as progress.

Users' scripts draw tqdm bars (Hugging Face datasets' ``map``, Accelerate's and Lightning's
loops): each update is ``\\r`` and the bar again, with no newline until the bar closes. torchrun's
``--tee`` copies each rank's output into the node's log with a text-mode ``readline`` (torch
2.14's ``tail_log``): every ``\\r`` becomes a line end, and a piece without one yet is copied
as it stands, prefixed, so the next piece copied (this rank's or another's) begins inside the
same line of the log (``...| 7/30 [00:00<00:00, 155.17 examples/s][rank0]: ``; the recorded
bytes are ``tests/fixtures/bars``). A log written without the tee keeps the ``\\r``.

- :class:`Splitter` puts the pieces back together: one :class:`Line` per line a writer (rank,
  torch 1.x's local rank, or the launcher) completed, what a terminal would show of it (the last
  ``\\r`` segment with something in it), no prefix left inside.
- :func:`is_bar` says whether a line is a bar, from its shape alone: the one place that knows it.
- :class:`Collapser` keeps each writer's latest bar and lets it out once that bar is done (the
  writer's next line that is not that bar, or the end of the file): a bar reads as one line.
- :class:`Board` draws the bars still moving at the foot of a terminal, redrawn in place.

Every text is bounded (``MAX_CHARS`` a line), whatever a log holds.
"""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, TextIO

from clustertrain import protocol

# A line beyond this is given in pieces (as runs/logs.py reads a log: follow.MAX_PARTIAL bytes).
MAX_CHARS = 1 << 20
# A bar is a line of a terminal: one longer than this is something else (and the patterns below
# are never run over a megabyte).
_BAR_CHARS = 4096
# The tee's prefix where a piece begins inside a line: the launch script's template, space
# included ("[rank${rank}]: "), or torch 1.x's "[default<local rank>]:".
_PIECE = re.compile(r"\[rank\d+\]: |\[default\d+\]:")
# tqdm's two shapes (tqdm.format_meter): "desc:  40%|████      | 12/30 [00:00<00:00, 192.76
# examples/s]" with a total, "desc: 6it [00:00, 81.92it/s]" without one; the rate is "?it/s",
# "12.3kit/s" or "1.52s/it", the unit the script's (" examples").
# Each pattern begins with a literal ("%|", " ["), which the regular expression engine looks for
# first: a log's every line is asked.
_PERCENT = re.compile(r"%\|[^|]{0,400}\|")
_PERCENTAGE = re.compile(r"(?:^|[\s:])(\d{1,3})$")  # just before the "%|"
_TIMING = re.compile(
    r" \[(?:\d+:)?\d\d:\d\d(?:<[\d:?]{1,12})?, *(?:\?|\d[\d.]*[kMGTPEZY]?) ?[^\s\],]{0,40}"
    r"(?:/s|s/[^\s\],]{1,40})[,\]]"
)
_COUNT = re.compile(r"(?:^|[\s:])(\d[\d.]*)[kMGTPEZY]?(?: ?[^\s\[\]\d][^\s\[\]]{0,40})?$")
# tqdm's total, beside the percentage: "| 12/30 [".
_TOTAL = re.compile(r"\| *\d[\d.]*[kMGTPEZY]?/(\d[\d.]*[kMGTPEZY]?) \[")
# Error text stays error text, whatever it quotes.
_ERROR = re.compile(r"^(?:Traceback \(|[A-Za-z_][\w.]*(?:Error|Exception)\b|error:)")
# Blank lines a writer may have pending before its next line shows what they were.
_MAX_BLANKS = 64
# Terminal escapes (a bar's colour, a cursor moved for nested bars) are no part of its shape.
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True)
class Line:
    """One line of a log, split from its writer's prefix: ``rank`` (torch 2), ``local`` (torch
    1.x), or neither for the launcher's own lines. ``folded`` counts the lines a summary stands
    for (0 for a line as written)."""

    rank: int | None
    local: int | None
    text: str
    folded: int = 0


def split_prefix(line: str) -> tuple[int | None, int | None, str]:
    """A line's (global rank, local rank, text): torch 2 prefixes "[rankN]: ", torch 1.x
    "[defaultL]:" with the local rank only; a launcher's own lines have neither."""
    if match := protocol.RANK_PREFIX.match(line):
        return int(match[1]), None, line[match.end() :]
    if match := protocol.LOCAL_RANK_PREFIX.match(line):
        return None, int(match[1]), line[match.end() :]
    return None, None, line


def _shape(text: str) -> tuple[str, int, str] | None:
    """A bar's description, how far along it is and its total ("" unknown); None for a line
    that is not a bar."""
    if len(text) > _BAR_CHARS or not ("%|" in text or "/s" in text or "s/" in text):
        return None  # most lines, at the cost of a few substring searches
    return _bar_shape(text)


# The reader, the folder and the label ask of the same line in turn: it is looked at once.
@functools.lru_cache(maxsize=64)
def _bar_shape(text: str) -> tuple[str, int, str] | None:
    if _ERROR.match(text):
        return None
    plain = _ESCAPE.sub("", text) if "\x1b" in text else text
    found = _PERCENT.search(plain)
    if found and (match := _PERCENTAGE.search(plain, max(0, found.start() - 4), found.start())):
        total = _TOTAL.search(plain, found.end() - 1)
        return plain[: match.start(1)].strip(), int(match[1]), total[1] if total else ""
    found = _TIMING.search(plain)
    if found and (match := _COUNT.search(plain, max(0, found.start() - 60), found.start())):
        return plain[: match.start(1)].strip(), int(float(match[1])), ""
    return None


def is_bar(text: str) -> bool:
    """Whether a line is a progress bar's state (tqdm's shapes, see above), not text: a bar on
    stderr is progress, not an error, and never a failure's evidence."""
    return _shape(text) is not None


def overwritten(text: str) -> str:
    """What a terminal shows of ``text`` once its ``\\r`` have been written: the last segment
    with something in it (a bar's last state; tqdm clears a closed bar with blanks)."""
    if "\r" not in text:
        return text
    return next((part for part in reversed(text.split("\r")) if part.strip()), "")


def _unerased(text: str) -> str:
    """``text`` from its last segment with something in it: what a later ``\\r`` may still
    overwrite is all that is worth keeping of a line not yet complete."""
    end = len(text)
    while (cut := text.rfind("\r", 0, end)) >= 0:
        if text[cut + 1 : end].strip():
            return text[cut + 1 :]
        end = cut
    return text


Key = tuple[int | None, int | None]


class Splitter:
    """One log file's lines in, its writers' lines out (see above); at most one unfinished line
    of ``MAX_CHARS`` per writer is held."""

    def __init__(self) -> None:
        self._partial: dict[Key, str] = {}

    def feed(self, line: str) -> list[Line]:
        if "[" not in line[1:] or not _PIECE.search(line, 1):
            return [self._complete(*split_prefix(line))]
        starts = [0, *(m.start() for m in _PIECE.finditer(line, 1)), len(line)]
        pieces = [split_prefix(line[a:b]) for a, b in zip(starts, starts[1:], strict=False)]
        unfinished: dict[Key, list[str]] = {}
        for rank, local, text in pieces[:-1]:  # copied before its line end was written
            unfinished.setdefault((rank, local), []).append(text)
        # Joined once a line: a rank's dots printed without a newline are a piece each.
        for key, texts in unfinished.items():
            held = self._partial.get(key, "") + "".join(texts)
            self._partial[key] = (_unerased(held) if "\r" in held else held)[-MAX_CHARS:]
        return [self._complete(*pieces[-1])]

    def finish(self) -> list[Line]:
        """The end of the file: what a writer left unfinished."""
        held, self._partial = self._partial, {}
        return [Line(rank, local, overwritten(text)) for (rank, local), text in held.items()]

    def _complete(self, rank: int | None, local: int | None, text: str) -> Line:
        held = self._partial.pop((rank, local), "")
        return Line(rank, local, overwritten(held + text if held else text))


def unerased(line: bytes) -> bytes:
    """A line not yet complete, less what its ``\\r`` overwrote: its writer's prefix and its
    last segment with something in it (bytes as read: latin-1 maps each to one character)."""
    text = line.decode("latin-1")
    rest = split_prefix(text)[2]
    return (text[: len(text) - len(rest)] + _unerased(rest)).encode("latin-1")


def read_lines(handle: BinaryIO, piece: int) -> Iterator[str]:
    """The lines of an open log, read a line at a time: a line over ``piece`` bytes comes in
    pieces of that size, but where it holds a ``\\r``, what that overwrote is dropped as it is
    read: a 10 MB line of a bar's updates reads as its last state, as ``follow.Tail`` reads it."""
    held, cut = b"", False
    while raw := handle.readline(piece):
        if cut and raw == b"\n" and not held:
            cut = False  # the end of a line already given in pieces
            continue
        cut = not raw.endswith(b"\n")
        line, held = held + raw.rstrip(b"\n"), b""
        if cut and b"\r" in line:
            held = unerased(line)
            if len(held) <= piece:
                continue
            held = b""
        yield line.decode("utf-8", "replace")
    if held:
        yield held.decode("utf-8", "replace")


def writers_lines(lines: Iterable[str]) -> Iterator[Line]:
    """``lines`` of one log (in order) as their writers completed them."""
    splitter = Splitter()
    for line in lines:
        yield from splitter.feed(line)
    yield from splitter.finish()


@dataclass
class _Held:
    bar: Line | None = None
    blanks: int = 0


class Collapser:
    """Each writer's bar as one line, its last state (see above). ``feed`` answers the lines to
    show now, and the bar state that is still moving, if the line is one. Without ``hold``
    (``logs --raw``), every line is shown as it comes."""

    def __init__(self, hold: bool = True) -> None:
        self.hold = hold
        self._held: dict[Key, _Held] = {}

    def feed(self, line: Line) -> tuple[list[Line], Line | None]:
        if not self.hold:
            return [line], None
        key = (line.rank, line.local)
        held = self._held.setdefault(key, _Held())
        if not line.text.strip():
            # The tee turns a bar's first "\r" into an empty line: blanks next to a bar are not
            # the script's. Only their number is held, and only so many.
            if held.bar is None and held.blanks >= _MAX_BLANKS:
                return [Line(line.rank, line.local, "")], None
            held.blanks += 1
            return [], None
        shape = _shape(line.text)
        if shape is None:
            done = self._release(key, held)
            return [*done, line], None
        last = _shape(held.bar.text) if held.bar is not None else None
        # Another bar, or the same one again (the next epoch's): the one before it is done.
        new = last is not None and (
            last[0] != shape[0] or last[2] != shape[2] or shape[1] < last[1]
        )
        done = [held.bar] if new and held.bar is not None else []
        held.bar, held.blanks = line, 0
        return done, line

    def finish(self) -> list[Line]:
        """The end of the file: every bar's last state, and blanks no bar explains."""
        done = [line for key, held in self._held.items() for line in self._release(key, held)]
        self._held.clear()
        return done

    @staticmethod
    def _release(key: Key, held: _Held) -> list[Line]:
        if held.bar is not None:
            done, held.bar, held.blanks = [held.bar], None, 0
            return done
        blanks, held.blanks = held.blanks, 0
        return [Line(key[0], key[1], "")] * blanks


def description(text: str) -> str:
    """A bar's description ("Epoch 0"), what the bars of several ranks share."""
    shape = _shape(text)
    return shape[0] if shape is not None else ""


# Lines a terminal gives the moving bars before they are drawn a line per description.
MAX_LIVE = 8
_ERASE = "\x1b[{}F\x1b[J"  # up to the board's first line, then clear to the screen's end
# Where a bar still moving is shown: its key ("node1 rank0"), the line as printed (None once
# it is done) and its text as written (Board.update).
Progress = Callable[[str, str | None, str], None]


def _columns() -> int:
    return shutil.get_terminal_size().columns


class Board:
    """The lines printed and, on a terminal (``live``), the bars still moving below them: a line
    each, or once more than ``MAX_LIVE`` move, a line per description (the least advanced of
    them), redrawn in place. Lines are cut to ``columns``: one that wrapped would not be erased
    whole. Elsewhere it only prints."""

    def __init__(self, out: TextIO, live: bool, columns: Callable[[], int] = _columns) -> None:
        self.out, self.live, self.columns = out, live, columns
        self._live: dict[str, tuple[str, str, int]] = {}
        self._drawn = 0
        self._dirty = False

    def update(self, key: str, shown: str | None, text: str = "") -> None:
        """``key``'s bar (``shown`` as printed, its ``text`` as written); None: it is done."""
        if shown is None:
            self._dirty |= self._live.pop(key, None) is not None
            return
        shape = _shape(text)
        self._live[key] = (shown, shape[0] if shape else "", shape[1] if shape else 0)
        self._dirty = True

    def print(self, line: str) -> None:
        """A line to keep, above the board."""
        self._erase()
        self.out.write(line + "\n")
        self.out.flush()
        self._dirty = bool(self._live)

    def draw(self) -> None:
        if not (self.live and self._dirty):
            return
        self._erase()
        width = max(self.columns() - 1, 10)
        lines = [line[:width] for line in self._lines()]
        self.out.write("".join(line + "\n" for line in lines))
        self.out.flush()
        self._drawn, self._dirty = len(lines), False

    def close(self) -> None:
        """The board erased (the lines printed stay); a later ``draw`` draws it again."""
        self._erase()
        self.out.flush()
        self._dirty = bool(self._live)

    def _lines(self) -> list[str]:
        if len(self._live) <= MAX_LIVE:
            return [shown for shown, _, _ in self._live.values()]
        groups: dict[str, list[tuple[int, str]]] = {}
        for shown, desc, along in self._live.values():
            groups.setdefault(desc, []).append((along, shown))
        lines = [f"{len(bars)} bars, the least along: {min(bars)[1]}" for bars in groups.values()]
        more = len(lines) - MAX_LIVE
        return lines[:MAX_LIVE] + ([f"... and {more} more"] if more > 0 else [])

    def _erase(self) -> None:
        if self._drawn:
            self.out.write(_ERASE.format(self._drawn))
            self._drawn = 0

"""A rank's stack, read: its main thread's frames, where it waits, and ranks grouped by stack.

Pure functions over the text that faulthandler (a rank with the runtime library, on
``protocol.DUMP_SIGNAL``) or ``py-spy dump`` (any other Python process) writes. The watchdog's
hang line (clustertrain.node.watchdog) and ``clustertrain stacks`` (every rank's stack of a live
job) both read stacks through these, so a rank is placed the same way by both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clustertrain import protocol

# A frame as faulthandler writes it, and as py-spy does.
_FAULTHANDLER = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
_PY_SPY = re.compile(r"^\s+(?P<func>\S.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
# Frames of Python itself and of installed packages: the place a rank waits is named by its
# innermost frame, and where in the user's code by the innermost frame outside these.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")
NO_STACK = "no stack (it did not answer)"


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    @property
    def users(self) -> bool:
        """Whether this frame is the user's own code, not Python's or an installed package's."""
        return not _LIBRARY.search(self.file)

    def __str__(self) -> str:
        return f"{self.func} ({Path(self.file).name}:{self.line})"


def main_frames(stack: str) -> list[Frame]:
    """The main thread's frames, innermost first; empty where the dump names none (yet)."""
    for block in re.split(r"\n(?=\S)", stack):
        frames = [
            Frame(m["func"], m["file"], int(m["line"]))
            for line in block.splitlines()
            if (m := _FAULTHANDLER.match(line) or _PY_SPY.match(line))
        ]
        # faulthandler writes no thread names: the main thread is the one that starts in a module.
        # Under `python -m`, runpy's frames sit below the module's: any <module> frame will do.
        if frames and (any(f.func == "<module>" for f in frames) or '"MainThread"' in block):
            return frames
    return []


def where(stack: str) -> str | None:
    """Where a rank's main thread is, from faulthandler's dump or py-spy's: ``func (file:N)``,
    the innermost function and the innermost line of the user's own code."""
    frames = main_frames(stack)
    return place(frames) if frames else None


def place(frames: Sequence[Frame]) -> str:
    """``func (file:N)``: the innermost function, and the innermost line of the user's code."""
    user = next((f for f in frames if f.users), frames[0])
    return f"{frames[0].func} ({Path(user.file).name}:{user.line})"


def tool(stack: str) -> str:
    """Which tool wrote ``stack``: py-spy's dump starts with its process line."""
    return "py-spy" if stack.startswith("Process ") else "faulthandler"


def taken_by(stack: str) -> str:
    """The tool that took a stack that names where the rank is; "none" for one that does not."""
    return tool(stack) if where(stack) else "none"


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads stand in the same frames (file and line, innermost first)."""

    ranks: tuple[int, ...]
    frames: tuple[Frame, ...]
    place: str  # where(): innermost function, innermost user line; NO_STACK without frames

    def head(self) -> str:
        """``ranks 0-2, 4-7 (7): all_reduce (train.py:88)``."""
        return f"{protocol.rank_list(self.ranks)} ({len(self.ranks)}): {self.place}"

    def lines(self) -> list[str]:
        """The head, then each frame outermost first, the user's own marked with ``>``."""
        said = [self.head()]
        for frame in reversed(self.frames):
            mark = ">" if frame.users else " "
            said.append(f"  {mark} {frame.func}  {frame.file}:{frame.line}")
        return said

    def as_dict(self) -> dict[str, object]:
        return {
            "ranks": list(self.ranks),
            "place": self.place,
            "frames": [
                {"func": f.func, "file": f.file, "line": f.line, "user": f.users}
                for f in self.frames
            ],
        }


def group(stacks: Mapping[int, str]) -> list[Group]:
    """Ranks with the same main-thread frames once each; the odd ones out first (the fewest
    ranks, then the lowest rank), ranks that wrote no stack last."""
    found: dict[tuple[Frame, ...], list[int]] = {}
    for rank in sorted(stacks):
        found.setdefault(tuple(main_frames(stacks[rank])), []).append(rank)
    groups = [
        Group(tuple(ranks), frames, place(frames) if frames else NO_STACK)
        for frames, ranks in found.items()
    ]
    return sorted(groups, key=lambda g: (not g.frames, len(g.ranks), g.ranks[0]))

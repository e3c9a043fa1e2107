"""Linux's inotify and statfs, through libc (ctypes): which files of a folder were written, and
on what kind of filesystem, without a ``stat`` per file.

The follower (:mod:`clustertrain.runs.follow`) watches folders, never files: the logs folder and
each attempt folder, one watch each, so a 65,536-file attempt costs one watch of the
``fs.inotify.max_user_watches`` a user has (8,192 on older kernels). A folder's watch hears a
file in it written (``IN_MODIFY``, ``IN_CLOSE_WRITE``), made or moved in (``IN_CREATE``,
``IN_MOVED_TO``, a folder too), and the folder itself deleted or moved away, after which its
path no longer names what is watched. One inotify instance serves a whole follow, every task of a
sweep included: a user has 128 (``fs.inotify.max_user_instances``).

What the kernel says is input: each ``struct inotify_event`` is parsed within the bytes read,
a record that does not fit ends the batch as an overflow would, and a name is kept only when the
folder's pattern accepts it whole. A watch never follows a symlink (``IN_DONT_FOLLOW``) and is
only ever of a folder (``IN_ONLYDIR``). A queue that overflowed (``IN_Q_OVERFLOW``), a folder
gone, a record that does not parse: each bumps ``Watcher.generation``, which tells every
follower to look at every file once, so no line waits on an event that never came.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
# What a folder's watch asks for. IN_EXCL_UNLINK: nothing from a file once it is unlinked.
MASK = (
    IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
    | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
)  # fmt: skip
# The folder's path no longer names the watched folder (the kernel sends IN_IGNORED last).
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT
# struct inotify_event: int wd; uint32_t mask, cookie, len; char name[len] (NUL-padded).
_HEADER = struct.Struct("=iIII")
# The kernel pads a name (at most NAME_MAX = 255 bytes and its NUL) to a multiple of the header.
_MAX_NAME = 256
# A read returns whole records only; 64 KiB holds over 2,000 of them. At most _MAX_READS reads a
# cycle: what is left waits in the kernel's queue for the next cycle (or overflows it, which
# is a sweep, never a lost line).
READ_BYTES = 64 << 10
_MAX_READS = 16
# Errors that say the user's inotify limits are spent (instances, watches, kernel memory).
LIMITS = (errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM)
LIMITS_HINT = "fs.inotify.max_user_instances and max_user_watches"


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    name: bytes


OVERFLOW = Event(-1, IN_Q_OVERFLOW, b"")


def parse(data: bytes) -> list[Event]:
    """The records in ``data``, in order. A record whose length is beyond a name's, or that
    runs past the end, ends the list with :data:`OVERFLOW`: what follows cannot be trusted."""
    events: list[Event] = []
    at = 0
    while at < len(data):
        if at + _HEADER.size > len(data):
            return [*events, OVERFLOW]
        wd, mask, _cookie, length = _HEADER.unpack_from(data, at)
        start, at = at + _HEADER.size, at + _HEADER.size + length
        if length > _MAX_NAME or at > len(data):
            return [*events, OVERFLOW]
        events.append(Event(wd, mask, data[start:at].split(b"\0", 1)[0]))
    return events


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """libc's functions, typed; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.inotify_init1.argtypes, libc.inotify_init1.restype = [ctypes.c_int], ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.inotify_rm_watch.restype = ctypes.c_int
        libc.statfs.argtypes, libc.statfs.restype = [ctypes.c_char_p, ctypes.c_void_p], ctypes.c_int
    except AttributeError:  # a libc without them (musl has them; an odd build might not)
        return None
    return libc


def _failed(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call}: {os.strerror(number)}")


def filesystem_type(path: Path) -> int | None:
    """The ``f_type`` that statfs(2) gives for ``path`` (NFS_SUPER_MAGIC and the like), or None
    where it cannot say (off Linux, no such path). ``os.statvfs`` has no such field."""
    libc = _libc()
    if libc is None:
        return None
    # struct statfs is 120 bytes on 64-bit Linux, 84 on 32-bit; f_type comes first, a long
    # (__fsword_t), but an unsigned int on s390x.
    buffer = ctypes.create_string_buffer(256)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        return None
    kind = ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_long
    return kind.from_buffer(buffer).value & 0xFFFFFFFF


class Inotify:
    """One inotify instance: a non-blocking descriptor, watches added and removed, events read
    in bounded pieces. Raises OSError where there is none (``LIMITS``, or ENOSYS off Linux)."""

    def __init__(self) -> None:
        libc = _libc()
        if libc is None:
            raise OSError(errno.ENOSYS, "inotify: not on this system")
        self._libc = libc
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise _failed("inotify_init1")

    def add(self, folder: str) -> int:
        """Watch ``folder`` (only a real folder, never through a symlink); its descriptor."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), MASK)
        if wd < 0:
            raise _failed("inotify_add_watch")
        return int(wd)

    def remove(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)  # EINVAL once the kernel dropped it: fine

    def read(self) -> list[Event]:
        """What the kernel has queued, at most ``_MAX_READS`` reads of it."""
        events: list[Event] = []
        for _ in range(_MAX_READS):
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                break
            events += parse(data)
            if len(data) < READ_BYTES - _HEADER.size - _MAX_NAME:
                break  # the queue was emptied
        return events

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class _Folder:
    path: str
    names: re.Pattern[str]
    changed: set[str] = field(default_factory=set)


@dataclass
class Watcher:
    """The folders a follow watches and, for each, the names written since it was last asked.
    Where inotify runs out (``LIMITS``), it says so once and is ``broken``: the followers poll."""

    inotify: Inotify
    say: Callable[[str], None]
    generation: int = 0  # bumped when an event may have been lost: every file looked at once
    broken: bool = False
    _by_wd: dict[int, _Folder] = field(default_factory=dict)
    _by_path: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, say: Callable[[str], None]) -> Watcher | None:
        """A watcher, or None (said once) where inotify cannot be had."""
        try:
            return cls(Inotify(), say)
        except OSError as exc:
            say(f"following by polling: inotify unavailable ({exc.strerror}; {LIMITS_HINT})")
            return None

    def watch(self, folder: str, names: re.Pattern[str]) -> bool:
        """Watch ``folder`` for the names ``names`` accepts; False where it is no folder now
        (gone, a symlink) or inotify is spent."""
        if folder in self._by_path:
            return True
        if self.broken:
            return False
        try:
            wd = self.inotify.add(folder)
        except OSError as exc:
            if exc.errno in LIMITS:
                self.broken = True
                self.say(
                    f"following by polling from now: inotify cannot watch one more folder "
                    f"({os.strerror(exc.errno)}; {LIMITS_HINT})"
                )
            return False
        if wd in self._by_wd:  # the same folder by another path: the newest path names it
            del self._by_path[self._by_wd[wd].path]
        self._by_wd[wd] = _Folder(folder, names)
        self._by_path[folder] = wd
        return True

    def drain(self) -> None:
        """Read what the kernel queued into each folder's names."""
        for event in self.inotify.read():
            folder = self._by_wd.get(event.wd)
            if event.mask & IN_Q_OVERFLOW:
                self.generation += 1
            elif folder is None:
                continue  # a watch forgotten already (its IN_IGNORED comes after)
            elif event.mask & _GONE:
                self._forget(event.wd, folder)
            elif event.name:
                name = os.fsdecode(event.name)
                if folder.names.fullmatch(name):
                    folder.changed.add(name)

    def take(self, folder: str) -> set[str] | None:
        """The names written in ``folder`` since last asked; None if it is not watched."""
        wd = self._by_path.get(folder)
        if wd is None:
            return None
        found, self._by_wd[wd].changed = self._by_wd[wd].changed, set()
        return found

    def _forget(self, wd: int, folder: _Folder) -> None:
        """The path names another folder now, or none: it is looked at again from scratch."""
        self.inotify.remove(wd)
        del self._by_wd[wd]
        if self._by_path.get(folder.path) == wd:
            del self._by_path[folder.path]
        self.generation += 1

    def close(self) -> None:
        self.inotify.close()

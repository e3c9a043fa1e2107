"""Reading files that anyone who can write a run folder may have crafted: bounded, never
through a symlink, never blocking on a FIFO or a device; printing their text safely; and the
few that must be this user's alone (what is unpickled), written and read back.

Every reader of run folders, event logs and sweep tables uses these, on the submit side and
the rank side alike.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from clustertrain.errors import UserError


class RunFolderError(UserError):
    """A run folder whose files are not what clustertrain wrote."""


def parse_json(data: bytes | str, what: str) -> Any:
    """``data`` as JSON. What is not UTF-8, not JSON, nested deeper than the decoder goes
    (its RecursionError) or holds an integer too long to read is a :class:`RunFolderError`
    naming ``what``: one forged file says so in one line, it breaks no listing."""
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RunFolderError(f"{what}: not the JSON clustertrain writes") from None


def printable(text: str) -> str:
    """``text`` with control characters (terminal escapes, newlines) shown as escapes.

    Names and log lines come from run folders, which anyone who can write there may craft.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else ascii(c)[1:-1] for c in text)


_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def open_regular(path: Path, within: Path | None = None) -> BinaryIO:
    """A regular file, open for reading: a symlink (even one put there since the file was
    listed), a FIFO or a device is refused without blocking, as :class:`RunFolderError`. With
    ``within`` (a run folder), every part of ``path`` below it is opened from the folder's
    descriptor, never through a symlink: a subfolder swapped for a link, at any depth and at
    any moment, leads nowhere."""
    try:
        fd = os.open(path, _READ) if within is None else _open_below(path, within)
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc.strerror})") from None
    return _regular(fd, path)


def open_regular_at(folder: int, path: Path) -> BinaryIO:
    """The regular file ``path.name`` in the folder open as ``folder`` (:func:`open_folder`),
    as :func:`open_regular` would open ``path``: for many files of one folder, which is then
    resolved once (the final pass of ``logs --follow`` opens every log)."""
    try:
        fd = os.open(path.name, _READ, dir_fd=folder)
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc.strerror})") from None
    return _regular(fd, path)


def _regular(fd: int, path: Path) -> BinaryIO:
    """``fd`` as a file to read, if it is a regular file (checked first: fdopen refuses a
    folder); else closed, and :class:`RunFolderError`."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFolderError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def open_folder(path: Path, within: Path | None = None) -> int:
    """A descriptor of the folder ``path``, for :func:`open_regular_at`; opened as
    :func:`open_regular` opens a file (with ``within``, every part from its descriptor, never
    through a symlink). The caller closes it. :class:`RunFolderError` where it cannot be."""
    try:
        if within is None or path == within:
            return os.open(path, _FOLDER)
        return _open_below(path, within, _FOLDER)
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc.strerror})") from None


def _open_below(path: Path, within: Path, flags: int = _READ) -> int:
    """``path`` opened one part at a time from ``within`` (itself no symlink) with openat and
    ``O_NOFOLLOW``; a path that is not below ``within`` is refused."""
    parts = path.relative_to(within).parts if path.is_relative_to(within) else ()
    if not parts or any(part in (".", "..") for part in parts):
        raise OSError(errno.EXDEV, f"not inside {within}")
    folder = os.open(within, _FOLDER)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _FOLDER, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(parts[-1], flags, dir_fd=folder)
    finally:
        os.close(folder)


def read_regular(path: Path, limit: int, tail: bool = False, within: Path | None = None) -> bytes:
    """At most ``limit`` bytes of a regular file (:func:`open_regular`, ``within`` as there),
    the last ones with ``tail``; a larger file without ``tail`` is refused."""
    with open_regular(path, within) as handle:
        size = os.fstat(handle.fileno()).st_size
        if tail and size > limit:
            handle.seek(size - limit)
        elif not tail and size > limit:
            raise RunFolderError(f"{path}: larger than {limit} bytes")
        return handle.read(limit)


def read_own(path: Path, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes that only this user can have
    written: this user's, not writable by anyone else, in a folder (never a symlink) of which
    the same holds. What is unpickled must be such a file; anything else is a
    :class:`RunFolderError`."""
    try:
        folder = os.lstat(path.parent)
    except OSError as exc:
        raise RunFolderError(f"{path.parent}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISDIR(folder.st_mode) or not _own(folder):
        raise RunFolderError(f"{path.parent}: not a folder of this user's alone; not read")
    with open_regular(path) as handle:
        found = os.fstat(handle.fileno())
        if not _own(found):
            raise RunFolderError(f"{path}: not a file of this user's alone; not read")
        if found.st_size > limit:
            raise RunFolderError(f"{path}: larger than {limit} bytes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RunFolderError(f"{path}: larger than {limit} bytes")
    return data


def _own(found: os.stat_result) -> bool:
    return found.st_uid == os.getuid() and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def write_private(path: Path, data: bytes) -> None:
    """``data`` as ``path``, readable by this user alone (0600), whole or not at all: written
    beside it and renamed over it, so a reader never sees half."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise

"""The one way a tar from a login node becomes files here (what ``plot`` draws, a notebook's
value): whatever the host sends is input, and a hostile host chooses every byte of it.

Checked whole before anything is written, refused in one line (:class:`UnpackError`) otherwise:
a gzip, bzip2 or xz stream is decompressed here with its output bounded (a 300 kB gzip that
unpacks to 300 MiB is refused, never held); members are regular files and folders only (no
link, hard link, device, FIFO or sparse file, whose real size is not its size in the tar),
named below the destination in printable, bounded names, at most :attr:`Limits.members` of
them, and none of them this side's own records (``job.json``, ``remote.json``). The files are
written into a private folder inside the destination, then renamed into place from that
folder's descriptor, each folder on the way opened with ``O_NOFOLLOW``: a symlink planted in the
destination (at any depth) is never written through, and a refusal leaves nothing behind.
Debian 12's Python (3.11.2) has no ``tarfile.extractall(filter="data")``, so this is by hand.
"""

from __future__ import annotations

import bz2
import contextlib
import io
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from clustertrain import protocol
from clustertrain.errors import UserError

# This side's own records of a run: a login node's tar never replaces them.
KEPT = (protocol.RECORD_FILE, protocol.REMOTE_FILE)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class UnpackError(UserError):
    """A tar from a login node that is refused whole: one line, nothing written."""


@dataclass(frozen=True)
class Limits:
    """What one tar may hold: members, the bytes of one name (NAME_MAX per part), the bytes
    it unpacks to (headers included: what is decompressed), and the seconds spent on it."""

    members: int = 10_000
    name_bytes: int = 1024
    unpacked: int = 256 << 20
    seconds: float = 60.0


def unpack(data: bytes, here: Path, limits: Limits = Limits(), kept: Sequence[str] = KEPT) -> int:
    """The members of the tar ``data`` as files below the folder ``here``; how many files."""
    deadline = time.monotonic() + limits.seconds
    plain = _decompressed(data, limits.unpacked)
    try:
        with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
            files, folders = _checked(tar, limits, kept, deadline)
            return _write(tar, here, files, folders, deadline)
    except (tarfile.TarError, EOFError) as error:
        raise UnpackError(f"not a tar ({str(error)[:100]})") from None


def _decompressed(data: bytes, limit: int) -> bytes:
    """``data`` as a plain tar: decompressed when it starts as gzip, bzip2 or xz does, never
    beyond ``limit`` bytes (the decompressors' ``max_length``: the excess is never made)."""
    if data[:2] == b"\x1f\x8b":
        unzip = zlib.decompressobj(wbits=31)
        try:
            plain = unzip.decompress(data, limit + 1)
        except zlib.error as error:
            raise UnpackError(f"not a gzip stream ({error})") from None
    elif data[:3] == b"BZh" or data[:6] == b"\xfd7zXZ\x00":
        maker = bz2.BZ2Decompressor if data[:1] == b"B" else lzma.LZMADecompressor
        unpacker = maker()
        try:
            plain = unpacker.decompress(data, limit + 1)
        except (OSError, lzma.LZMAError, EOFError) as error:
            raise UnpackError(f"not a compressed tar ({error})") from None
    else:
        plain = data
    if len(plain) > limit:  # max_length stops at limit + 1: the rest is never made
        raise UnpackError(f"unpacks to more than {limit} bytes; nothing was written")
    return plain


def _checked(
    tar: tarfile.TarFile, limits: Limits, kept: Sequence[str], deadline: float
) -> tuple[list[tuple[tarfile.TarInfo, tuple[str, ...]]], set[tuple[str, ...]]]:
    """Every member read and checked before one is written: (file, its parts) and folders."""
    files: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    folders: set[tuple[str, ...]] = set()
    for count, member in enumerate(tar, start=1):
        if count > limits.members or time.monotonic() > deadline:
            raise UnpackError(
                f"more than {limits.members} members or {limits.seconds:.0f} s to read; "
                "nothing was written"
            )
        parts = _parts(member.name, limits.name_bytes)
        if not parts and not member.isdir():  # a file named "" or ".": the run folder itself
            raise UnpackError(f"{_shown(member.name)}: not a file's name; nothing was written")
        if member.isdir():
            folders.update(parts[:end] for end in range(1, len(parts) + 1))
        elif member.isreg() and not member.issparse() and member.type != tarfile.CONTTYPE:
            if parts[-1] in kept:
                raise UnpackError(f"{_shown(member.name)}: this side's own record; not replaced")
            files.append((member, parts))
            folders.update(parts[:end] for end in range(1, len(parts)))
        else:
            raise UnpackError(
                f"{_shown(member.name)}: not a regular file or folder (a link, a device or a "
                "sparse file); nothing was written"
            )
    clash = {parts for _, parts in files} & folders
    if clash or len({parts for _, parts in files}) != len(files):
        raise UnpackError("a name given twice, or as both a file and a folder")
    return files, folders


def _parts(name: str, limit: int) -> tuple[str, ...]:
    """The parts of a member's name below the destination; anything else is refused."""
    parts = tuple(part for part in PurePosixPath(name).parts if part != ".")
    if (
        len(name.encode("utf-8", "surrogateescape")) > limit
        or not name.isprintable()
        or name.startswith("/")
        or ".." in parts
        or any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in parts)
    ):
        raise UnpackError(f"{_shown(name)}: not a name below the run folder; nothing was written")
    return parts


def _shown(name: str) -> str:
    return ascii(name[:80])


def _write(
    tar: tarfile.TarFile,
    here: Path,
    files: list[tuple[tarfile.TarInfo, tuple[str, ...]]],
    folders: set[tuple[str, ...]],
    deadline: float,
) -> int:
    """Write ``files`` into a private folder inside ``here``, check every place they go, then
    rename them into place. Nothing is left behind on a refusal."""
    try:
        top = os.open(here, _DIR)
    except OSError as error:
        raise UnpackError(f"{here}: not a folder of this run ({error.strerror})") from None
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=here))  # 0700, a fresh name
    try:
        stage = os.open(staging, _DIR)
        try:
            for number, (member, _) in enumerate(files):
                _copy(tar, member, stage, str(number), deadline)
            _check_places(top, files, folders)
            for number, (_, parts) in enumerate(files):
                with _folder(top, parts[:-1]) as inner:
                    os.rename(str(number), parts[-1], src_dir_fd=stage, dst_dir_fd=inner)
        finally:
            os.close(stage)
    except OSError as error:
        raise UnpackError(f"cannot write into {here} ({error.strerror})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(top)
    return len(files)


def _copy(
    tar: tarfile.TarFile, member: tarfile.TarInfo, stage: int, name: str, deadline: float
) -> None:
    source = tar.extractfile(member)
    if source is None or time.monotonic() > deadline:
        raise UnpackError(f"{_shown(member.name)}: cannot be read in time; nothing was written")
    with os.fdopen(os.open(name, _NEW, 0o600, dir_fd=stage), "wb") as out:
        shutil.copyfileobj(source, out)


def _check_places(
    top: int,
    files: list[tuple[tarfile.TarInfo, tuple[str, ...]]],
    folders: set[tuple[str, ...]],
) -> None:
    """Refuse before any rename where a file would land on a folder or a folder on anything
    but a real folder (a symlink included): the renames then cannot fail half-way."""
    for parts in sorted(folders, key=len):
        kind = _kind(top, parts)
        if kind not in (None, "dir"):
            raise UnpackError(f"{_shown('/'.join(parts))}: here not a folder; nothing was written")
    for _, parts in files:
        if _kind(top, parts) == "dir":
            raise UnpackError(f"{_shown('/'.join(parts))}: here a folder; nothing was written")


def _kind(top: int, parts: tuple[str, ...]) -> str | None:
    try:
        found = os.stat("/".join(parts), dir_fd=top, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return "dir" if stat.S_ISDIR(found.st_mode) else "other"


@contextlib.contextmanager
def _folder(top: int, parts: tuple[str, ...]) -> Iterator[int]:
    """The folder ``parts`` below ``top``, made (0700) where missing, each part opened without
    following a symlink; its descriptor."""
    fd = os.dup(top)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            inner = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)

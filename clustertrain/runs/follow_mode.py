"""How `logs --follow` learns of new lines: inotify where it hears every write, polling elsewhere.

inotify reports the writes that pass through this machine's kernel. On a local filesystem that is
every write. On a shared one (NFS, Lustre, GPFS, CephFS, BeeGFS, SMB, a FUSE mount) the job's
nodes write through their own kernels and this one hears none of it: the follower would see
their lines only at its safety sweep, every 10 s. So inotify is chosen only on the local
filesystems named in ``LOCAL``, by the ``f_type`` statfs(2) gives for the logs folder; a shared
one, one not known, or a folder statfs cannot answer is polled. Where inotify cannot be had
(``fs.inotify.max_user_instances`` or ``max_user_watches`` spent), the follower polls and says so
once on stderr; otherwise it says nothing, its stdout the same either way.

``CLUSTERTRAIN_FOLLOW=poll|inotify|auto`` overrides the choice (``auto``, or unset, is the choice
above), for tests and for a user who knows the filesystem better: ``inotify`` on a shared
filesystem sees other nodes' lines only at the safety sweep and the final pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clustertrain.errors import FieldError
from clustertrain.runs import inotify

ENV_FOLLOW = "CLUSTERTRAIN_FOLLOW"
AUTO, POLL, INOTIFY = "auto", "poll", "inotify"
# statfs f_type values (<linux/magic.h>, and each filesystem's own for those not in it).
SHARED = {
    0x00006969: "NFS",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2",
    0x00C36400: "CephFS",
    0x19830326: "BeeGFS",
    0x65735546: "FUSE",
}
LOCAL = {
    0x0000EF53: "ext2/3/4",
    0x58465342: "XFS",
    0x9123683E: "Btrfs",
    0x2FC12FC1: "ZFS",
    0xCA451A4E: "bcachefs",
    0xF2F52010: "F2FS",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    # A container's writable layer: its writes go through this kernel like any local one.
    0x794C7630: "overlayfs",
}


@dataclass(frozen=True)
class Mode:
    """How a follow learns of new lines (``POLL`` or ``INOTIFY``), and why."""

    name: str
    why: str


def setting(environ: Mapping[str, str] | None = None) -> str:
    """``$CLUSTERTRAIN_FOLLOW``, checked; an empty one is no choice (``auto``)."""
    value = (os.environ if environ is None else environ).get(ENV_FOLLOW) or AUTO
    if value not in (AUTO, POLL, INOTIFY):
        raise FieldError(ENV_FOLLOW, value, f"must be {POLL}, {INOTIFY} or {AUTO}")
    return value


def choose(asked: str, fs_type: int | None) -> Mode:
    """The mode for a logs folder on a filesystem of type ``fs_type`` (None: unknown)."""
    if asked != AUTO:
        return Mode(asked, f"{ENV_FOLLOW}={asked}")
    if fs_type in LOCAL:
        return Mode(INOTIFY, f"{LOCAL[fs_type]}: a local filesystem")
    if fs_type in SHARED:
        return Mode(POLL, f"{SHARED[fs_type]}: inotify does not hear other machines' writes")
    if fs_type is None:
        return Mode(POLL, "the filesystem's type is unknown")
    return Mode(POLL, f"filesystem type {fs_type:#x} is not known to be local")


def mode_for(logs: Path, environ: Mapping[str, str] | None = None) -> Mode:
    """The mode for following ``logs`` (its run folder's type where it does not exist yet)."""
    asked = setting(environ)
    if asked != AUTO:
        return choose(asked, None)
    fs_type = inotify.filesystem_type(logs)
    return choose(asked, fs_type if fs_type is not None else inotify.filesystem_type(logs.parent))


def watcher(
    logs: Path, say: Callable[[str], None], environ: Mapping[str, str] | None = None
) -> inotify.Watcher | None:
    """What a follow of ``logs`` watches with, or None: it polls."""
    if mode_for(logs, environ).name == POLL:
        return None
    return inotify.Watcher.open(say)

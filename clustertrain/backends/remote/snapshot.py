"""The code a remote job runs: a snapshot of the git tree that holds the submit directory, sent
once to a content-addressed folder of the login node, ``~/.clustertrain/code/<hash>`` (0700).

A clean tree is ``git archive HEAD``, named by its tree id. A tree with uncommitted changes is
refused, listing them, unless ``allow_dirty``: then the tracked files and the untracked ones git
does not ignore are sent as they are now, named by the hash of what is sent. Ignored files
never are (that is where secrets and data live). A snapshot already on the host is not sent
again: its ``.complete`` marker is written last, so a half-sent one is never taken for whole.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from clustertrain.errors import UserError

from . import ssh

REMOTE_ROOT = ".clustertrain/code"  # under the login node's $HOME
COMPLETE = ".complete"
_SHOWN = 5


@dataclass(frozen=True)
class Snapshot:
    digest: str  # hex: the tree id, or the hash of a dirty tree's files
    prefix: str  # the submit directory within the tree ("" or "sub/dir/")
    top: Path  # the tree's top folder here
    files: bytes | None  # a dirty tree's tar; a clean one's is made only to be sent

    def archive(self) -> bytes:
        return self.files if self.files is not None else _git(self.top, "archive", "HEAD")


def _git(top: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(top), *args], capture_output=True, check=False)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UserError(f"git {args[0]} in {top}: {(said or ['failed'])[-1][:200]}")
    return done.stdout


def check_inside(path: Path, directory: Path) -> None:
    """Refuse a file (a job file) outside the git tree holding ``directory``: the login node
    would read whatever is at that path on *its* disk (on a shared login node, anyone's)."""
    inside = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--show-toplevel"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    top = Path(inside.stdout.strip()).resolve() if inside.returncode == 0 else None
    if top is not None and not (directory / path).resolve().is_relative_to(top):
        raise UserError(
            f"job file: {path} is outside the git tree sent to the login node ({top}); "
            "move it into the tree, or submit on the login node itself"
        )


def take(directory: Path, allow_dirty: bool = False) -> Snapshot:
    """The snapshot of the tree holding ``directory``; refuses a dirty tree without
    ``allow_dirty`` and a directory outside git, each in one line."""
    inside = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--show-toplevel", "--show-prefix"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if inside.returncode != 0:
        raise UserError(
            f"submit directory: {directory} is not in a git tree, and --host sends a git "
            "snapshot; run `git init && git add -A && git commit -m code` there, or run "
            "clustertrain on the login node itself"
        )
    top_text, prefix = (inside.stdout.splitlines() + [""])[:2]
    top = Path(top_text)
    changed = changes(top)
    if changed and not allow_dirty:
        more = len(changed) - _SHOWN
        shown = ", ".join(changed[:_SHOWN]) + (f" and {more} more" if more > 0 else "")
        raise UserError(
            f"working tree: {len(changed)} uncommitted change(s) in {top}: {shown}; commit "
            "them, or send the files as they are with --allow-dirty"
        )
    if not changed:
        tree = _git(top, "rev-parse", "HEAD^{tree}").decode().strip()
        return Snapshot(tree, prefix, top, None)
    archive = _tar_of_files(top)
    return Snapshot(hashlib.sha256(archive).hexdigest()[:40], prefix, top, archive)


def changes(top: Path) -> list[str]:
    """Modified, staged, deleted and untracked-but-not-ignored files, as git names them."""
    out = _git(top, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    entries = [e.decode("utf-8", "replace") for e in out.split(b"\0") if e]
    return [entry[3:] for entry in entries if len(entry) > 3]


def _tar_of_files(top: Path) -> bytes:
    """Tracked and untracked-not-ignored files as they are now, in a tar that depends on their
    names, modes and contents only (so the same files give the same hash)."""
    listed = _git(top, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    names = sorted({n.decode("utf-8", "surrogateescape") for n in listed.split(b"\0") if n})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = top / name
            if path.is_symlink() or not path.is_file():  # deleted, or a link out of the tree
                continue
            info = tarfile.TarInfo(name)
            data = path.read_bytes()
            info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def remote_dir(snapshot: Snapshot) -> str:
    """The snapshot's folder on the login node, relative to its $HOME."""
    return f"{REMOTE_ROOT}/{snapshot.digest}"


def send(host: str, snapshot: Snapshot) -> bool:
    """Put ``snapshot`` on ``host`` unless it is there; whether it was sent."""
    folder = remote_dir(snapshot)
    # Only this module's text and a hex digest: nothing here comes from the user.
    if ssh.run(host, [], raw=f'test -e "$HOME"/{folder}/{COMPLETE}').returncode == 0:
        return False
    script = (
        f'cd "$HOME" && umask 077 && mkdir -p {REMOTE_ROOT} && rm -rf {folder}.partial && '
        f"mkdir {folder}.partial && tar -x -C {folder}.partial && "
        f"touch {folder}.partial/{COMPLETE} && rm -rf {folder} && mv {folder}.partial {folder}"
    )
    done = ssh.run(host, [], raw=script, stdin=snapshot.archive())
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
        raise UserError(f"host: {host}: the code snapshot was not unpacked: {said[-1][:200]}")
    return True

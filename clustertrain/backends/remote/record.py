"""A login node's record of a job, here: ``remote.json`` (protocol.REMOTE_FILE) beside the
``job.json`` the login node wrote, saying the host, the run folder there and which clustertrain.
Every value in it is input: checked before it reaches ssh's command line.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, printable, read_regular
from clustertrain.runs import Run, make_run_folder, read_run

from . import ssh

# Where the login node's clustertrain keeps run folders of jobs submitted from elsewhere.
REMOTE_RUNS = ".clustertrain/runs"
RECORD_BYTES = 64 << 10  # as this side reads a job record (runs.folder)
# A run folder's name as runs.new_run_dir makes it (a slug, its time, 6 hex digits).
_FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_SAFE_PATH = re.compile(r"/[^\x00-\x1f\x7f]{1,4000}")


@dataclass(frozen=True)
class Remote:
    host: str
    run_dir: str  # the run folder on the host
    clustertrain: str  # the command that runs clustertrain there


def of(run: Run) -> Remote | None:
    """The remote side of ``run``, if it was submitted with ``--host``; every value checked."""
    path = run.path / protocol.REMOTE_FILE
    if not path.exists():
        return None
    try:
        data = parse_json(read_regular(path, 16 << 10), str(path))
        found = Remote(**data)
    except (RunFolderError, UnicodeDecodeError, ValueError, TypeError):
        raise UserError(f"{path}: not a clustertrain remote record") from None
    ssh.check_host(found.host)
    ssh.check_program(f"{path}: clustertrain", found.clustertrain)
    if not isinstance(found.run_dir, str) or not _SAFE_PATH.fullmatch(found.run_dir):
        raise UserError(f"{path}: bad value {printable(repr(found.run_dir))[:80]}")
    # Its last part reaches the host's command line as the JOB argument (_run_words): one
    # that starts with '-' would be read as an option there, '.' or '..' as another folder.
    name = PurePosixPath(found.run_dir).name
    if name.startswith("-") or name in ("", ".", "..") or found.run_dir.endswith("/"):
        raise UserError(
            f"{path}: bad run_dir {printable(repr(found.run_dir))[:80]}: its folder name must "
            "not start with '-' nor be '.' or '..'"
        )
    return found


def record_here(remote: Remote, runs_root: Path) -> Run:
    """This side's run folder: the job's record as the host wrote it, and where it is."""
    name = PurePosixPath(remote.run_dir).name
    if (
        not _SAFE_PATH.fullmatch(remote.run_dir)
        or not _FOLDER_NAME.fullmatch(name)
        or remote.run_dir.endswith("/")
    ):
        raise UserError(
            f"host: {remote.host}: said run folder {printable(repr(remote.run_dir))[:80]}, "
            "which is not the name of a clustertrain run folder"
        )
    where = str(PurePosixPath(remote.run_dir, protocol.RECORD_FILE))
    record = ssh.run(remote.host, ["cat", where], limit=RECORD_BYTES, what="its job record")
    if record.returncode != 0:
        raise UserError(f"host: {remote.host}: no job record in {printable(remote.run_dir)}")
    path = runs_root / name
    try:
        make_run_folder(path)  # it will hold what comes back (a notebook's value): private
    except OSError as error:
        raise UserError(f"run folder: cannot create {path} ({error.strerror})") from None
    (path / protocol.RECORD_FILE).write_bytes(record.stdout)
    try:
        run = read_run(path)
    except RunFolderError as error:
        (path / protocol.RECORD_FILE).unlink()
        path.rmdir()
        raise UserError(f"host: {remote.host}: {error}") from None
    (path / protocol.REMOTE_FILE).write_text(json.dumps(asdict(remote), indent=1) + "\n")
    return run


def run_words(remote: Remote) -> list[str]:
    """The run as the host's clustertrain finds it: a folder name under its runs root."""
    folder = PurePosixPath(remote.run_dir)
    return [folder.name, "--runs-dir", str(folder.parent)]

"""Queueing through a login node: the code sent as a snapshot, then the login node's own
clustertrain renders, checks, prepares and queues the job there (``submit``, or a notebook's
``notebook-submit``), and this side records what it says (record.py).
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clustertrain.errors import UserError
from clustertrain.files import printable
from clustertrain.runs import Run

from . import snapshot, ssh
from .record import REMOTE_RUNS, Remote, record_here

ERROR = "clustertrain: error: "
_SUBMITTED = re.compile(r"^submitted job (\S+)")
_RUN_FOLDER = re.compile(r"^run folder: (/.+)$")
# What a login node may say while it submits: a few lines (its prepare step's output too).
SAID_BYTES, LINE_BYTES = 16 << 20, 64 << 10


@dataclass(frozen=True)
class Request:
    """What a login node's clustertrain is asked to queue (the remote backend's own request,
    as a batch script is Slurm's): ``clustertrain COMMAND WORDS`` on ``host``, run in a snapshot
    of the git tree that holds this directory, reading ``stdin`` (a notebook's packed call)."""

    host: str
    words: tuple[str, ...]
    clustertrain: str = "clustertrain"
    command: str = "submit"
    stdin: bytes | None = None
    allow_dirty: bool = False
    job_file: str | None = None  # a job file here, which the snapshot must hold

    @property
    def dry_run(self) -> bool:
        return "--dry-run" in self.words[: self.words.index("--") if "--" in self.words else None]


def queue(
    request: Request, directory: Path, runs_root: Path, echo: Callable[[str], None] = print
) -> Run | None:
    """Send the code that holds ``directory``, have the login node queue ``request``, record
    the run here (under ``runs_root``) and return it; None for a dry run. What the login node
    says is ``echo``ed as it comes, but its error, which is raised here in one line."""
    host, clustertrain = request.host, request.clustertrain
    taken = snapshot.take(directory, request.allow_dirty)
    sent = snapshot.send(host, taken)
    echo(f"code: {'sent' if sent else 'already'} in {host}:~/{snapshot.remote_dir(taken)}")
    where = f'cd "$HOME"/{snapshot.remote_dir(taken)}/'
    raw = f"{where}{ssh.command([taken.prefix]) if taken.prefix else ''} && "
    raw += f'CLUSTERTRAIN_RUNS_DIR="$HOME"/{REMOTE_RUNS} exec '
    argv = ssh.argv(host, [clustertrain, request.command, *request.words], raw)
    lines, status = _stream(argv, echo, request.stdin)
    ssh.fail(host, [clustertrain], status, "\n".join(lines))
    said = next((line for line in reversed(lines) if line.startswith(ERROR)), "")
    if status != 0 and said:
        raise UserError(f"{said.removeprefix(ERROR)} (on {host})")
    if status == 0 and request.dry_run:
        return None
    job = next((m[1] for line in lines if (m := _SUBMITTED.match(line))), None)
    folder = next((m[1] for line in lines if (m := _RUN_FOLDER.match(line))), None)
    if status != 0 or job is None or folder is None:
        raise UserError(f"host: {host}: the submission failed there (exit status {status})")
    return record_here(Remote(host, folder, clustertrain), runs_root)


def _stream(
    argv: list[str], echo: Callable[[str], None], stdin: bytes | None = None
) -> tuple[list[str], int]:
    """Run ``argv`` with ``stdin`` (none: an empty one), echoing each line of its output (stdout
    and stderr) as it comes, its control characters escaped (the host's words are input). A
    host that says more than :data:`SAID_BYTES` (a submission says a few lines) is stopped and
    refused in one line; a line is cut at :data:`LINE_BYTES`."""
    lines, said = [], 0
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        writer = threading.Thread(target=ssh.give, args=(proc.stdin, stdin or b""), daemon=True)
        writer.start()
        while line := proc.stdout.readline(LINE_BYTES):
            said += len(line)
            if said > SAID_BYTES:
                proc.kill()
                raise UserError(f"host: its answer to the submission: more than {SAID_BYTES} "
                                "bytes; stopped")  # fmt: skip
            lines.append(printable(line.decode("utf-8", "replace").rstrip("\n")))
            if not lines[-1].startswith(ERROR):  # said once, as this side's own error
                echo(lines[-1])
        writer.join()
    return lines, proc.returncode

"""A remote cluster over SSH: submit from a laptop, follow and manage the job from there.

The job is rendered, checked against the real cluster's limits, prepared and queued by the
clustertrain installed on the login node, in a snapshot of the code (clustertrain.backends
.snapshot), so that everything a submission on the login node does happens there. This side
keeps the record: a run folder holding the job's ``job.json`` (as the login node wrote it) and
``remote.json`` (protocol.REMOTE_FILE: the host, the run folder there, which clustertrain).
``status``, ``cancel`` and ``logs`` on such a run are the login node's, through ssh; the Python
API's :class:`RemoteBackend` asks the same (``status --json``, read back by JobState.from_dict).

``logs --follow`` streams over the master connection; when the connection drops it connects
again and goes on, skipping the lines it already printed: the login node prints each source's
lines (a node's rank, a launcher) in their file order, so counting per source is exact.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, printable, read_regular
from clustertrain.jobstate import JOB_ID, JobState
from clustertrain.render import RenderedJob
from clustertrain.runs import Run, make_run_folder, read_run
from clustertrain.spec import sweep
from clustertrain.version import __version__

from . import snapshot, ssh
from .base import Backend

if TYPE_CHECKING:
    from clustertrain.runs.logs import Filter

# Where the login node's clustertrain keeps run folders of jobs submitted from elsewhere.
REMOTE_RUNS = ".clustertrain/runs"
RECONNECT_S, RECONNECT_WITHIN_S = 2.0, 60.0
_ERROR = "clustertrain: error: "
_SUBMITTED = re.compile(r"^submitted job (\S+)")
_RUN_FOLDER = re.compile(r"^run folder: (/.+)$")
_SOURCE = re.compile(r"^(\S+ \S+) [|!] ")
_ENDED = re.compile(r"^clustertrain: job \S+ ended \S+$")
_SAID_BYTES = 64 << 10
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


def submit(
    host: str,
    args: Sequence[str],
    directory: Path,
    runs_root: Path,
    allow_dirty: bool = False,
    clustertrain: str = "clustertrain",
    echo: Callable[[str], None] = print,
    command: str = "submit",
    stdin: bytes | None = None,
) -> tuple[Run | None, bool]:
    """Send the code, submit on ``host`` with ``args`` (a ``submit`` command line without
    ``--host``; or another ``command`` that queues as submit does, given ``stdin``), record
    the run here; returns it (None for a dry run), and whether code was sent."""
    taken = snapshot.take(directory, allow_dirty)
    sent = snapshot.send(host, taken)
    echo(f"code: {'sent' if sent else 'already'} in {host}:~/{snapshot.remote_dir(taken)}")
    where = f'cd "$HOME"/{snapshot.remote_dir(taken)}/'
    raw = f"{where}{ssh.command([taken.prefix]) if taken.prefix else ''} && "
    raw += f'CLUSTERTRAIN_RUNS_DIR="$HOME"/{REMOTE_RUNS} exec '
    lines, status = _stream(ssh.argv(host, [clustertrain, command, *args], raw), echo, stdin)
    ssh.fail(host, [clustertrain], status, "\n".join(lines))
    said = next((line for line in reversed(lines) if line.startswith(_ERROR)), "")
    if status != 0 and said:
        raise UserError(f"{said.removeprefix(_ERROR)} (on {host})")
    if status == 0 and "--dry-run" in args[: args.index("--") if "--" in args else len(args)]:
        return None, sent
    job = next((m[1] for line in lines if (m := _SUBMITTED.match(line))), None)
    folder = next((m[1] for line in lines if (m := _RUN_FOLDER.match(line))), None)
    if status != 0 or job is None or folder is None:
        raise UserError(f"host: {host}: the submission failed there (exit status {status})")
    remote = Remote(host, folder, clustertrain)
    return _record(remote, runs_root), sent


def _stream(
    argv: list[str], echo: Callable[[str], None], stdin: bytes | None = None
) -> tuple[list[str], int]:
    """Run ``argv`` with ``stdin`` (none: an empty one), echoing each line of its output (stdout
    and stderr) as it comes."""
    lines = []
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        writer = threading.Thread(target=_give, args=(proc.stdin, stdin or b""))
        writer.start()
        for said in proc.stdout:
            lines.append(said.decode("utf-8", "replace").rstrip("\n"))
            if not lines[-1].startswith(_ERROR):  # said once, as this side's own error
                echo(lines[-1])
        writer.join()
    return lines, proc.returncode


def _give(pipe: IO[bytes], data: bytes) -> None:
    """Write ``data`` to ``pipe`` and close it; a reader that left early is no error here (its
    exit status says why)."""
    with contextlib.suppress(BrokenPipeError, OSError), pipe:
        pipe.write(data)


def _record(remote: Remote, runs_root: Path) -> Run:
    """This side's run folder: the job's record as the host wrote it, and where it is."""
    name = PurePosixPath(remote.run_dir).name
    record = ssh.run(remote.host, ["cat", str(PurePosixPath(remote.run_dir, protocol.RECORD_FILE))])
    if record.returncode != 0 or not name or name.startswith("."):
        raise UserError(f"host: {remote.host}: no job record in {remote.run_dir}")
    path = runs_root / name
    make_run_folder(path)  # it will hold what comes back (a notebook's value): private
    (path / protocol.RECORD_FILE).write_bytes(record.stdout)
    try:
        run = read_run(path)
    except RunFolderError as error:
        (path / protocol.RECORD_FILE).unlink()
        path.rmdir()
        raise UserError(f"host: {remote.host}: {error}") from None
    (path / protocol.REMOTE_FILE).write_text(json.dumps(asdict(remote), indent=1) + "\n")
    return run


def _run_words(remote: Remote) -> list[str]:
    """The run as the host's clustertrain finds it: a folder name under its runs root."""
    folder = PurePosixPath(remote.run_dir)
    return [folder.name, "--runs-dir", str(folder.parent)]


def forward(remote: Remote, command: str, args: Sequence[str] = ()) -> int:
    """``clustertrain COMMAND RUN_DIR ARGS`` on the host, its output here; its exit status."""
    words = [remote.clustertrain, command, *_run_words(remote), *args]
    done = subprocess.run(ssh.argv(remote.host, words), check=False)
    if done.returncode in (127, 255):
        ssh.fail(remote.host, words, done.returncode, "")
    return done.returncode


class Streamed:
    """``logs`` on the host, its lines as they come, through every dropped connection, none
    twice; ``status`` is the host's exit status once the lines are done.

    A host that cannot be reached at first fails at once in one line, as any other command does
    (a ``true`` through the shared master connection, which ssh's ``ConnectTimeout`` bounds).
    Only a connection that was made and then dropped is made again: said once, tried quietly
    every ``RECONNECT_S`` for ``RECONNECT_WITHIN_S``, then one line."""

    def __init__(
        self, remote: Remote, args: Sequence[str], follow: bool = True, say_end: bool = True
    ) -> None:
        self.remote, self.status, self.say_end = remote, 0, say_end
        self.words = [remote.clustertrain, "logs", *_run_words(remote)]
        self.words += [*(["--follow"] if follow else []), *args]

    def __iter__(self) -> Iterator[str]:
        ssh.run(self.remote.host, ["true"], timeout=120)  # unreachable: one line, no retries
        printed: Counter[str] = Counter()
        while True:
            yield from self._once(printed)
            if self.status != 255:
                return
            print(f"clustertrain: the connection to {self.remote.host} dropped; connecting again "
                  f"(for up to {RECONNECT_WITHIN_S:.0f} s)", file=sys.stderr)  # fmt: skip
            if not self._reconnected():
                ssh.fail(self.remote.host, self.words, 255, "")

    def _once(self, printed: Counter[str]) -> Iterator[str]:
        """One connection's lines, less those ``printed`` already holds (per source)."""
        seen: Counter[str] = Counter()
        argv = ssh.argv(self.remote.host, self.words)
        with (
            tempfile.TemporaryFile() as said,  # a file: a full pipe would stop the host's lines
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=said, text=True, errors="replace"
            ) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                source = m[1] if (m := _SOURCE.match(line)) else ""
                seen[source] += 1
                if seen[source] > printed[source]:
                    printed[source] += 1
                    yield line
            proc.wait()
            said.seek(0)
            self._tell(said.read(_SAID_BYTES).decode("utf-8", "replace"))
        self.status = proc.returncode

    def _tell(self, said: str) -> None:
        """What ssh and the host said on stderr, but the job's end when the caller says it."""
        for line in said.splitlines():
            if self.say_end or not _ENDED.match(line):
                print(line, file=sys.stderr)

    def _reconnected(self) -> bool:
        """Whether the host answers again within ``RECONNECT_WITHIN_S`` (ssh's words unshown)."""
        deadline = time.monotonic() + RECONNECT_WITHIN_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(RECONNECT_S, left))
            probe = ssh.argv(self.remote.host, ["true"])
            try:
                if subprocess.run(probe, capture_output=True, timeout=max(left, 1)).returncode == 0:
                    return True
            except subprocess.TimeoutExpired:
                return False
        return False


def _follow(remote: Remote, args: Sequence[str], out: IO[str] = sys.stdout) -> int:
    """``logs --follow`` on the host, here; its exit status."""
    streamed = Streamed(remote, args)
    for line in streamed:
        out.write(line)
        out.flush()
    return streamed.status


class RemoteBackend(Backend):
    """A job that a login node's clustertrain rendered, checked and queued (:func:`submit`):
    its state, its lines and its cancellation are that clustertrain's answers, through ssh."""

    name = "ssh"
    job_ids = JOB_ID
    accepted = "queued"

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    @staticmethod
    def cancel_command(job_id: str) -> str:
        return f"scancel {job_id}  (on the login node)"

    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        raise UserError("host: the login node's clustertrain renders and checks the job there")

    def submit(self, job: RenderedJob) -> str:
        raise UserError("host: the login node's clustertrain queues the job; see remote.submit")

    def state(self, run: Run) -> JobState:
        said = self._ask("status", "--json")
        try:
            return JobState.from_dict(parse_json(said, "status --json"))
        except (RunFolderError, ValueError) as error:
            raise UserError(
                f"host: {self.remote.host}: status said no job state ({error})"
            ) from None

    def cancel(self, run: Run) -> None:
        self._ask("cancel")

    def logs(self, run: Run, filters: Filter, follow: bool = False) -> Iterator[str]:
        streamed = Streamed(self.remote, filters.words(), follow, say_end=False)
        return (line.rstrip("\n") for line in streamed)

    def sync(self, run: Run) -> None:
        fetch(self.remote, run.path)

    def relay(self, run: Run, command: str, args: Sequence[str] = (), follow: bool = False) -> int:
        if command == "logs" and follow:
            return _follow(self.remote, args)
        return forward(self.remote, command, args)

    def host(self) -> str:
        return self.remote.host

    def _ask(self, command: str, *args: str) -> str:
        """``clustertrain COMMAND RUN ARGS`` on the host; its output, or its error as one line."""
        words = [self.remote.clustertrain, command, *_run_words(self.remote), *args]
        done = ssh.run(self.remote.host, words, timeout=120)
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
            why = said[-1].removeprefix(_ERROR)[:300]
            raise UserError(
                f"{printable(why)} (on {self.remote.host}, exit status {done.returncode})"
            )
        return done.stdout.decode("utf-8", "replace")


def doctor(host: str, clustertrain: str, echo: Callable[[str], None] = print) -> int:
    """ssh, the login node's clustertrain against this one, then its own doctor (sbatch, the
    partitions); the exit status of the whole."""
    done = ssh.run(host, [clustertrain, "--version"], timeout=60)
    there = done.stdout.decode("utf-8", "replace").strip().rpartition(" ")[2]
    echo(f"ssh {host}: reached; clustertrain there: {there or 'no answer'}, here: {__version__}")
    status = subprocess.run(
        ssh.argv(
            host, [clustertrain, "doctor"], raw=f'CLUSTERTRAIN_RUNS_DIR="$HOME"/{REMOTE_RUNS} '
        ),
        check=False,
    ).returncode
    if there != __version__:
        echo(f"  - clustertrain {there or '?'} on {host} is not this one's {__version__}: "
             "install the same version there")  # fmt: skip
        return 1
    return status


# What plot reads from a run folder, fetched from the host (no logs, no checkpoints).
_DRAWN = (protocol.EVENTS_FILE, protocol.METRICS_FILE, sweep.TABLE)
FETCH_LIMIT = 256 << 20


def fetch(
    remote: Remote, here: Path, names: Sequence[str] = _DRAWN, limit: int = FETCH_LIMIT
) -> None:
    """Copy the plain files of the host's run folder that ``names`` match (``find -name``
    patterns: what ``plot`` draws, unless said) into ``here``; at most ``limit`` bytes."""
    matched = " -o ".join(f"-name {shlex.quote(name)}" for name in names)
    script = f"cd {shlex.quote(remote.run_dir)} && "
    script += f"find . -type f \\( {matched} \\) -print0 | tar -c --null -T - | head -c {limit + 1}"
    done = ssh.run(remote.host, [], raw=script)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
        raise UserError(f"host: {remote.host}: cannot read {remote.run_dir}: {said[-1][:200]}")
    if len(done.stdout) > limit:
        raise UserError(f"host: {remote.host}: {remote.run_dir}: over {limit} bytes to fetch")
    try:
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            _extract_files(tar, here)
    except tarfile.TarError as error:
        raise UserError(f"host: {remote.host}: {remote.run_dir}: {error}") from None


def _extract_files(tar: tarfile.TarFile, here: Path) -> None:
    """The plain files of ``tar`` written inside ``here``; anything else (a link, a device, a
    name that is absolute or climbs with ``..``) is skipped. By hand: Debian 12's Python
    (3.11.2) has no ``extractall(filter="data")``."""
    for member in tar:
        parts = [part for part in PurePosixPath(member.name).parts if part != "."]
        if not member.isreg() or not parts or parts[0] == "/" or ".." in parts:
            continue
        source = tar.extractfile(member)
        if source is None:
            continue
        target = here.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)  # a new file of this user's, never through a link
        with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(source.read(member.size))

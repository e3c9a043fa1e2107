"""What a login node's clustertrain answers for a run, here: a command forwarded (``status``,
``cancel``, ``results``), ``logs --follow`` streamed through dropped connections, and the files
``plot`` and a notebook read, fetched.

``logs --follow`` streams over the master connection; when the connection drops it connects
again and goes on, skipping the lines it already printed: the login node prints each source's
lines (a node's rank, a launcher) in their file order, so counting per source is exact.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import printable

from . import ssh, unpack
from .record import Remote, run_words

RECONNECT_S, RECONNECT_WITHIN_S = 2.0, 60.0
_SOURCE = re.compile(r"^(\S+ \S+) [|!] ")
_ENDED = re.compile(r"^clustertrain: job \S+ ended \S+$")
_SAID_BYTES = 64 << 10
LINE_BYTES = 1 << 20  # a longer line of the host's is printed in pieces of this many bytes


def forward(remote: Remote, command: str, args: Sequence[str] = (), tty: bool = False) -> int:
    """``clustertrain COMMAND RUN_DIR ARGS`` on the host, its output here; its exit status
    (``tty``: with a terminal there, ssh -t)."""
    words = [remote.clustertrain, command, *run_words(remote), *args]
    if tty:  # a terminal there and here (attach): the user's own session, not lines to read
        done = subprocess.run(ssh.argv(remote.host, words, tty=True), check=False)
        if done.returncode in (127, 255):
            ssh.fail(remote.host, words, done.returncode, "")
        return done.returncode
    with (
        tempfile.TemporaryFile() as said,  # a file: a full pipe would stop the host's lines
        subprocess.Popen(ssh.argv(remote.host, words), stdout=subprocess.PIPE, stderr=said) as proc,
    ):
        assert proc.stdout is not None
        while raw := proc.stdout.readline(LINE_BYTES):  # the host's words: input, escaped
            print(printable(raw.decode("utf-8", "replace").rstrip("\n")), flush=True)
        proc.wait()
        said.seek(0)
        told = said.read(_SAID_BYTES).decode("utf-8", "replace")
    if proc.returncode in (127, 255):
        ssh.fail(remote.host, words, proc.returncode, told)
    for line in told.splitlines():
        print(printable(line), file=sys.stderr)
    return proc.returncode


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
        self.words = [remote.clustertrain, "logs", *run_words(remote)]
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
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=said) as proc,
        ):
            assert proc.stdout is not None
            while raw := proc.stdout.readline(LINE_BYTES):  # a line of 2 GB: held in pieces
                line = printable(raw.decode("utf-8", "replace").rstrip("\n")) + "\n"
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
                print(printable(line), file=sys.stderr)

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


def follow(remote: Remote, args: Sequence[str], out: IO[str] = sys.stdout) -> int:
    """``logs --follow`` on the host, here; its exit status."""
    streamed = Streamed(remote, args)
    for line in streamed:
        out.write(line)
        out.flush()
    return streamed.status


# What plot reads from a run folder, fetched from the host (no logs, no checkpoints).
_DRAWN = (protocol.EVENTS_FILE, protocol.METRICS_FILE, protocol.SWEEP_TABLE)
FETCH_LIMIT = 256 << 20


def fetch(
    remote: Remote, here: Path, names: Sequence[str] = _DRAWN, limit: int = FETCH_LIMIT
) -> None:
    """Copy the plain files of the host's run folder that ``names`` match (``find -name``
    patterns: what ``plot`` draws, unless said) into ``here``; at most ``limit`` bytes, as
    sent and as unpacked (:mod:`.unpack`: whatever the host sends is checked whole here)."""
    matched = " -o ".join(f"-name {shlex.quote(name)}" for name in names)
    script = f"cd {shlex.quote(remote.run_dir)} && "
    script += f"find . -type f \\( {matched} \\) -print0 | tar -c --null -T - | head -c {limit + 1}"
    done = ssh.run(remote.host, [], raw=script, limit=limit, what="the files to fetch")
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
        raise UserError(
            f"host: {remote.host}: cannot read {printable(remote.run_dir)}: "
            f"{printable(said[-1][:200])}"
        )
    try:
        unpack.unpack(done.stdout, here, unpack.Limits(unpacked=limit))
    except unpack.UnpackError as error:
        raise UserError(f"host: {remote.host}: {printable(remote.run_dir)}: {error}") from None

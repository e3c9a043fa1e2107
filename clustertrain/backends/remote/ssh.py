"""A remote cluster's login node, through the system's OpenSSH client.

Every ssh of a command (and of the next hour's) shares one master connection: ``ControlMaster``
with a private ``ControlPath`` under ``~/.clustertrain/ssh`` and ``ControlPersist``, so a site
that asks for a second factor asks once. Whatever the user's ``~/.ssh/config`` says of the host
(ProxyJump, identities, agents, Kerberos) applies: this is ``ssh``, not a reimplementation.

A remote command is a list of words, each quoted for the remote shell (``shlex.quote``); the
few fixed fragments of this module's own (``cd "$HOME"/...``) are marked by passing them as
``raw``. The host is checked first: a value that starts with ``-`` would be an option of ssh.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from clustertrain.errors import FieldError, UserError
from clustertrain.files import printable

# A destination of ~/.ssh/config or user@host[:port]-free name: no option, no space, no control.
_HOST = re.compile(r"[A-Za-z0-9_.@%+\[\]:-]{1,255}")
PERSIST_S = 3600
CONNECT_TIMEOUT_S = 15
# What a login node's answer may take unless its caller says (a job record, a state, a cancel's
# words: all far smaller), and how much of what ssh and the host say on stderr is kept.
ANSWER_BYTES, SAID_BYTES = 1 << 20, 64 << 10


def check_host(host: object) -> str:
    # A value of the Python API (notebook_launcher(host=42)) is checked as a flag's would be.
    if not isinstance(host, str) or not _HOST.fullmatch(host) or host.startswith("-"):
        raise FieldError(
            "host",
            host,
            "give a destination of your ~/.ssh/config or user@host, without spaces or a "
            "leading '-'",
        )
    return host


def check_program(field: str, value: object) -> str:
    """The clustertrain to run on a login node, which the remote shell gets as one quoted word:
    a command on its PATH or an absolute path (a relative one, ``~/`` included, would not mean
    one program in every command); never ``-...`` (an option of ``exec``), no control character."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= 4096
        or value.startswith("-")
        or ("/" in value and not value.startswith("/"))
        or not value.isprintable()
    ):
        raise FieldError(
            field, value, "name the clustertrain there by an absolute path, like "
            "/opt/venv/bin/clustertrain, or a command on its PATH",
        )  # fmt: skip
    return value


def control_dir() -> Path:
    folder = Path.home() / ".clustertrain" / "ssh"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def options() -> list[str]:
    """ssh's options: the shared master connection, and no prompt where nobody can answer."""
    found = [
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control_dir()}/%C",
        "-o", f"ControlPersist={PERSIST_S}",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
    ]  # fmt: skip
    if not sys.stdin.isatty():  # a script or CI: fail instead of waiting for a password
        found += ["-o", "BatchMode=yes"]
    return found


def command(words: Sequence[str], raw: str = "") -> str:
    """The remote shell's command line: ``raw`` (this module's own text) then ``words``."""
    return raw + " ".join(shlex.quote(word) for word in words)


def argv(host: str, words: Sequence[str], raw: str = "", tty: bool = False) -> list[str]:
    """ssh's command line; ``tty``: ``-t``, a terminal on the host (an interactive shell)."""
    return [
        "ssh",
        *options(),
        *(["-t"] if tty else []),
        "--",
        check_host(host),
        command(words, raw),
    ]


def run(
    host: str,
    words: Sequence[str],
    raw: str = "",
    stdin: bytes | None = None,
    timeout: float = 600,
    limit: int = ANSWER_BYTES,
    what: str = "its answer",
) -> subprocess.CompletedProcess[bytes]:
    """``words`` on ``host``; an unreachable host, a refused login or a missing program is one
    line (:class:`UserError`); any other exit status is the caller's to read. The answer is
    read up to ``limit`` bytes (:func:`capped`): past it, or past ``timeout``, one line."""
    done = capped(argv(host, words, raw), stdin, timeout, limit, f"host: {host}: {what}")
    fail(host, words, done.returncode, done.stderr.decode("utf-8", "replace"))
    return done


def capped(
    command: list[str], stdin: bytes | None, timeout: float, limit: int, what: str
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command``: its stdout whole up to ``limit`` bytes, the last :data:`SAID_BYTES` of
    its stderr. A login node's answer is input: one of 2 GB would otherwise be held whole
    (``capture_output``: a MemoryError). Past ``limit`` or ``timeout`` the command is killed
    and :class:`UserError` says so in one line, naming ``what`` was read."""
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        if stdin is not None:
            threading.Thread(target=give, args=(proc.stdin, stdin), daemon=True).start()
        try:
            out, err = _drain(proc, time.monotonic() + timeout, limit)
        except UserError as error:
            proc.kill()
            raise UserError(f"{what}: {error}") from None
        status = proc.wait()
    return subprocess.CompletedProcess(command, status, out, err)


def _drain(proc: subprocess.Popen[bytes], deadline: float, limit: int) -> tuple[bytes, bytes]:
    """stdout (at most ``limit`` bytes) and stderr's tail, read as they come until both end."""
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as waiting:
        waiting.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        waiting.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while waiting.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError("no answer in time; stopped")
            for key, _ in waiting.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    waiting.unregister(key.fileobj)
                key.data.extend(chunk)
                if len(out) > limit:
                    raise UserError(f"more than {limit} bytes; refused")
                del err[:-SAID_BYTES]
    return bytes(out), bytes(err)


def give(pipe: IO[bytes], data: bytes) -> None:
    """Write ``data`` to ``pipe`` and close it; a reader that left early is no error here (its
    exit status says why)."""
    with contextlib.suppress(OSError), pipe:
        pipe.write(data)


def fail(host: str, words: Sequence[str], status: int, stderr: str) -> None:
    """Raise the one line that says why ssh did not run ``words`` (255, 127), if it did not."""
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    last = printable(last)  # ssh's words, or the host's: shown, never obeyed by the terminal
    if status == 255:
        if "Permission denied" in stderr or "Too many authentication failures" in stderr:
            why = "authentication failed"
        else:
            why = "cannot reach it"
        raise UserError(
            f"host: {host}: {why} ({last.strip()[:200]}); check that `ssh {host}` works"
        )
    if status == 127 and words:
        raise UserError(
            f"host: {host} has no `{words[0]}` ({last.strip()[:200]}); install clustertrain "
            "there, or name it with --remote-clustertrain PATH or in your hosts file "
            "(docs/remote.md)"
        )


def stop_master(host: str) -> None:
    """End the master connection (``ssh -O exit``), as a dropped network would."""
    subprocess.run(
        ["ssh", *options(), "-O", "exit", "--", check_host(host)], capture_output=True, check=False
    )

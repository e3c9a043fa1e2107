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

import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from clustertrain.errors import FieldError, UserError

# A destination of ~/.ssh/config or user@host[:port]-free name: no option, no space, no control.
_HOST = re.compile(r"[A-Za-z0-9_.@%+\[\]:-]{1,255}")
PERSIST_S = 3600
CONNECT_TIMEOUT_S = 15


def check_host(host: str) -> str:
    if not _HOST.fullmatch(host) or host.startswith("-"):
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
    timeout: float | None = 600,
) -> subprocess.CompletedProcess[bytes]:
    """``words`` on ``host``; an unreachable host, a refused login or a missing program is one
    line (:class:`UserError`); any other exit status is the caller's to read."""
    done = subprocess.run(
        argv(host, words, raw), input=stdin, capture_output=True, timeout=timeout, check=False
    )
    fail(host, words, done.returncode, done.stderr.decode("utf-8", "replace"))
    return done


def fail(host: str, words: Sequence[str], status: int, stderr: str) -> None:
    """Raise the one line that says why ssh did not run ``words`` (255, 127), if it did not."""
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
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

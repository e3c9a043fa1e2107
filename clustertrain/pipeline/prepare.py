"""The prepare step: a job's commands run on the submit host, once, before anything is queued.

Compute nodes have no route beyond their cluster at most sites, while the login node reaches
the package index, the hub or the data store, and shares its filesystems with the nodes. So
what a job needs from the internet is fetched here (``prepare: [python, -m, jobs.mnist.data]``),
in the submit directory, with the job's environment and virtual environment; a job never waits
on a network timeout, and a failure costs seconds here instead of a trip through the queue.

Each command is a list of words handed to ``execve``: no shell reads it. Its output is shown
live, each line prefixed, and kept in the run folder (``prepare.log``). A command that fails or
is interrupted stops the submission before anything is written or queued.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import IO, BinaryIO

from clustertrain.errors import UserError
from clustertrain.render import venv_environment
from clustertrain.spec import JobSpec

PREFIX = "prepare | "
# How long a command may take to end after it was asked to (SIGTERM) before it is killed.
_TERM_GRACE_S = 10


class PrepareError(UserError):
    """A prepare command failed or was interrupted: nothing was queued."""


class _Interrupted(Exception):
    """The user interrupted a running command, which was then ended with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def environment(spec: JobSpec, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the job's virtual environment first on PATH and the job's ``env`` set,
    as the nodes will have them (the offline switches are not: this step is the one online)."""
    env = dict(base)
    env.update(venv_environment(spec.venv, env))
    env.update(dict(spec.env))
    return env


def run(spec: JobSpec, workdir: str, out: IO[str] | None = None) -> BinaryIO:
    """Run every prepare command in turn; returns their output (an anonymous file, at its
    start). Raises :class:`PrepareError` on the first that fails or is interrupted."""
    out = out or sys.stderr
    log: BinaryIO = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller
    env = environment(spec, os.environ)
    try:
        for command in spec.prepare:
            try:
                _run_one(command, workdir, env, out, log)
            except (KeyboardInterrupt, _Interrupted) as exc:
                # Ctrl-C may come before the command started as well as while it runs.
                status = exc.status if isinstance(exc, _Interrupted) else "none: not started"
                raise PrepareError(
                    f"prepare: `{shlex.join(command)}` was interrupted (exit status {status}); "
                    "nothing was queued; run the submission again to prepare afresh"
                ) from None
    except BaseException:
        log.close()
        raise
    log.seek(0)
    return log


def _run_one(
    command: tuple[str, ...], workdir: str, env: dict[str, str], out: IO[str], log: BinaryIO
) -> None:
    shown = shlex.join(command)
    out.write(f"{PREFIX}$ {shown}\n")
    out.flush()
    try:
        # PATH lookup uses env's PATH, so `python` is the job's virtual environment's.
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        raise PrepareError(
            f"prepare: `{shown}` could not start ({exc.strerror}); nothing was queued; fix the "
            "command or skip the step with --no-prepare"
        ) from None
    last = ""
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.write(raw)
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            last = text.rsplit("\r", 1)[-1].strip() or last  # progress bars redraw with \r
            out.write(f"{PREFIX}{text}\n")
            out.flush()
        status = proc.wait()
    except KeyboardInterrupt:
        raise _Interrupted(_stop(proc)) from None
    if status != 0:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        said = f": {last}" if last else " without a word"
        raise PrepareError(
            f"prepare: `{shown}` {how}{said}; nothing was queued; fix "
            "it, or skip the step with --no-prepare if what it makes is already there"
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """End an interrupted command (a terminal's Ctrl-C reached it too; a signal to this
    process alone did not) and return its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()

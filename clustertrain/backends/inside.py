"""Inside a running job, through any backend's ``node_command``: a shell on one of its nodes
(``attach``), every rank's stack (``stacks``) and its nodes' and ranks' figures (``top``).

Each first asks the backend for the job's allocation (``Backend.holding``) and refuses, in
one line, a job that does not run now, another user's job and a node it does not hold; then one
overlapping step runs a node-side module on its nodes (clustertrain.node.stacks, .top,
.attach), which finds the step's ranks there itself: nothing read from the run folder names a
process. What comes back is read as input (clustertrain.runs.top, clustertrain.node.frames).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.backends.base import Backend
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, printable, read_regular
from clustertrain.jobstate import Holding
from clustertrain.node import beats, frames
from clustertrain.runs import Run
from clustertrain.runs import top as topview
from clustertrain.spec import jobfile

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
# How long one overlapping step on every node may take: a step's launch (about a second), then
# the stacks (a signal, else py-spy: clustertrain.node.stacks waits for each at most 60 s).
NODE_WAIT_S = 120.0
STACKS_DIR = "stacks"  # in the run folder: a fresh folder of rank-N.stack files per call
_ATTEMPT = re.compile(re.escape(protocol.ATTEMPT_DIR) + r"(\d{1,6})")
_STACK = re.compile(r"rank-(\d{1,6})\.stack")
_NOT_STARTED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"})


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=NODE_WAIT_S, check=False
        )
    except FileNotFoundError:
        raise UserError(f"{argv[0]}: not found; run this where the job's scheduler is") from None
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{argv[0]}: the job's nodes did not answer within {NODE_WAIT_S:.0f} s"
        ) from None


@dataclass(frozen=True)
class Inside:
    """A running job of this user, as a command inside it needs it."""

    run: Run
    holding: Holding
    heartbeats: Path  # the step's heartbeat folder, as its ranks were given it


def enter(backend: Backend, run: Run, node: str | None = None) -> Inside:
    """The job's allocation, checked: it runs now, it is this user's, and holds ``node``."""
    if node is not None and not protocol.NODE_NAME.fullmatch(node):
        raise UserError(f"--node: {printable(node[:40])!r} is not a node name (e.g. node2)")
    found = backend.holding(run)
    if found.state in _NOT_STARTED:
        raise UserError(f"JOB: {run.job_id} is {found.state}: nothing runs inside it yet")
    if found.state != "RUNNING":
        raise UserError(f"JOB: {run.job_id} is {found.state}: nothing runs inside it any more")
    if found.uid is not None and found.uid != os.getuid():
        raise UserError(f"JOB: {run.job_id} is another user's (uid {found.uid}), not yours")
    if not found.nodes:
        raise UserError(f"JOB: {run.job_id}: its scheduler names no node of it")
    if node is not None and node not in found.nodes:
        held = ", ".join(found.nodes)
        raise UserError(f"--node: {node} is not one of job {run.job_id}'s nodes ({held})")
    return Inside(run, found, heartbeats(run))


def heartbeats(run: Run) -> Path:
    """The newest attempt's heartbeat folder (logs/attempt-K/heartbeats)."""
    numbers = [
        int(match[1])
        for path in (run.logs_dir.iterdir() if run.logs_dir.is_dir() else ())
        if (match := _ATTEMPT.fullmatch(path.name))
    ]
    attempt = f"{protocol.ATTEMPT_DIR}{max(numbers, default=0)}"
    return run.logs_dir / attempt / protocol.HEARTBEAT_DIR


def _node_module(module: str, *args: str) -> list[str]:
    """A node-side module run by this Python (on the nodes' shared file system, as the run
    folder is), the job's own way of starting clustertrain on a node."""
    return [sys.executable, "-m", f"clustertrain.node.{module}", *args]


@dataclass(frozen=True)
class Stacks:
    job_id: str
    folder: Path
    groups: tuple[frames.Group, ...]
    tools: Mapping[int, str]  # rank: the tool that took its stack

    def lines(self) -> list[str]:
        ranks = sum(len(g.ranks) for g in self.groups)
        said = [f"job {self.job_id}: {ranks} rank(s) in {len(self.groups)} group(s), the odd "
                f"ones first; > marks your code; stacks in {self.folder}"]  # fmt: skip
        by_tool: dict[str, list[int]] = {}
        for rank, tool in sorted(self.tools.items()):
            by_tool.setdefault(tool, []).append(rank)
        taken = ", ".join(f"{t} for {protocol.rank_list(r)}" for t, r in by_tool.items())
        said[0] += f" (by {taken})" if taken else ""
        for found in self.groups:
            said += ["", *found.lines()]
        return said

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "folder": str(self.folder),
            "groups": [g.as_dict() for g in self.groups],
            "tools": {str(rank): tool for rank, tool in sorted(self.tools.items())},
        }


def stacks(backend: Backend, run: Run, runner: Runner = _run) -> Stacks:
    """Every rank's Python stack now, the job left running: grouped, the odd ones first."""
    inside = enter(backend, run)
    folder = _fresh_folder(run)
    argv = _node_module("stacks", str(inside.heartbeats), str(folder))
    done = runner(backend.node_command(run, argv))
    found = _read_stacks(folder, run.path)
    if not found:
        why = (done.stderr.strip().splitlines() or ["no process of its step on its nodes"])[-1]
        raise UserError(f"JOB: {run.job_id}: no rank's stack was taken ({printable(why[:200])})")
    tools = {rank: frames.taken_by(text) for rank, text in found.items()}
    return Stacks(run.job_id, folder, tuple(frames.group(found)), tools)


def _fresh_folder(run: Run) -> Path:
    """A new folder under the run folder's ``stacks/``, which must be a folder, not a link."""
    parent = run.path / STACKS_DIR
    if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
        raise RunFolderError(f"run folder: {parent} is not a folder clustertrain made")
    parent.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for suffix in ("", *(f"-{n}" for n in range(1, 100))):
        try:
            (parent / f"{stamp}{suffix}").mkdir()
        except FileExistsError:
            continue
        return parent / f"{stamp}{suffix}"
    raise UserError(f"{parent}: too many stacks taken this second")


def _read_stacks(folder: Path, within: Path) -> dict[int, str]:
    found = {}
    for path in sorted(folder.iterdir()):
        if match := _STACK.fullmatch(path.name):
            try:
                data = read_regular(path, 1 << 20, tail=False, within=within)
            except (OSError, RunFolderError):
                continue
            found[int(match[1])] = data.decode("utf-8", "replace")
    return found


def top(
    backend: Backend,
    run: Run,
    before: Mapping[int, beats.Beat] | None = None,
    runner: Runner = _run,
) -> tuple[topview.View, dict[int, beats.Beat]]:
    """The job's nodes and ranks now, and the heartbeats read (``before`` for the next call:
    step times over the time between the two)."""
    inside = enter(backend, run)
    first = before if before is not None else beats.read(inside.heartbeats, run.path)
    done = runner(backend.node_command(run, _node_module("top", str(inside.heartbeats))))
    figures = [found for line in done.stdout.splitlines() if (found := topview.node_figures(line))]
    after = beats.read(inside.heartbeats, run.path)
    silent = tuple(n for n in inside.holding.nodes if n not in {f.node for f in figures})
    view = topview.view(run.job_id, figures, first, after, time.time(), silent)
    return view, after


def attach_command(
    backend: Backend, run: Run, node: str | None, command: Sequence[str], pty: bool
) -> list[str]:
    """The command line of a shell (or ``command``, as argv) on ``node`` (the job's first by
    default) in the job's environment (clustertrain.node.attach)."""
    inside = enter(backend, run, node)
    words = ["--chdir", inside.holding.workdir] if inside.holding.workdir else []
    for name, value in _job_environment(run).items():
        words += ["--env", f"{name}={value}"]
    if venv := _job_venv(run):
        words += ["--path", f"{venv}/bin"]
    argv = _node_module("attach", str(inside.heartbeats), *words, "--", *(command or ["bash"]))
    return backend.node_command(run, argv, node or inside.holding.nodes[0], pty=pty)


def _spec(run: Run) -> Mapping[str, Any]:
    try:
        found = jobfile.load(str(run.path / protocol.SPEC_FILE))
    except UserError:
        return {}
    return found if isinstance(found, Mapping) else {}


def _job_environment(run: Run) -> dict[str, str]:
    """The job's ``env`` as its run folder records it; a name that is not one is left out."""
    env = _spec(run).get("env")
    if not isinstance(env, Mapping):
        return {}
    return {
        str(name): str(value)
        for name, value in env.items()
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", str(name)) and "\0" not in str(value)
    }


def _job_venv(run: Run) -> str | None:
    venv = _spec(run).get("venv")
    return venv if isinstance(venv, str) and venv.startswith("/") and "\0" not in venv else None

"""Takes the stacks of this node's ranks of a step, without stopping them.

``python -m clustertrain.node.stacks HEARTBEAT_DIR OUT_DIR`` runs on every node of the job (an
overlapping step): the watchdog runs it on a hang (OUT_DIR is then HEARTBEAT_DIR itself), and
``clustertrain stacks`` on a live job (a fresh folder of the run folder). It writes
``OUT_DIR/rank-N.stack`` for each rank found here, one stack each:

- a rank with the runtime library registered faulthandler on ``protocol.DUMP_SIGNAL`` when it
  first beat (clustertrain.rank.runtime), appending each dump to ``rank-N.dumps``: it is sent
  the signal (it answers even inside a C call) and what it appended is its stack;
- any other rank, and one that did not answer within ``DUMP_WAIT_S``, is read with ``py-spy
  dump`` (it pauses the process for milliseconds; ptrace, which the job's own user has).

Only processes found here as the step's ranks are signalled or read: their environment names
the step's heartbeat folder, a RANK and a LOCAL_RANK, and this node (``ranks_here``); no PID
is taken from a file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from clustertrain import protocol
from clustertrain.node import frames
from clustertrain.procs import start_time

# How long the ranks have to write their stacks after the signal; how long py-spy may take on
# one rank (it may wait for a process that is being descheduled on a busy node).
DUMP_WAIT_S, PY_SPY_WAIT_S = 5.0, 60.0
MAX_DUMP_BYTES = 1 << 20  # a rank with thousands of threads: the main thread comes first
# A stack file is written afresh and never through a link someone left in its place.
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW


class Found(NamedTuple):
    pid: int
    rank: int
    started: str | None  # the process's start time when found (clustertrain.procs)


def take(heartbeats: Path, out: Path) -> dict[int, str]:
    """Every rank of this node's step: its stack written to ``out/rank-N.stack``; returns which
    tool took each ("faulthandler", "py-spy", or why none)."""
    out.mkdir(parents=True, exist_ok=True)
    here = ranks_here(heartbeats)
    asked = [found for found in here if _dumps(heartbeats, found.rank).is_file()]
    offsets = {found.rank: _size(_dumps(heartbeats, found.rank)) for found in asked}
    for found in asked:
        if start_time(found.pid) == found.started:  # the same process still, not a reused PID
            os.kill(found.pid, getattr(signal, f"SIG{protocol.DUMP_SIGNAL}"))
    answered = _wait_for_dumps(heartbeats, offsets)
    taken = {}
    for found in here:
        stack = answered.get(found.rank)
        if stack is None:
            stack = _py_spy(found.pid)
        fd = os.open(out / f"rank-{found.rank}.stack", _WRITE, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(stack)
        taken[found.rank] = frames.taken_by(stack)
    return taken


def _dumps(heartbeats: Path, rank: int) -> Path:
    return heartbeats / f"rank-{rank}{protocol.DUMPS_SUFFIX}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _wait_for_dumps(heartbeats: Path, offsets: dict[int, int]) -> dict[int, str]:
    """Each signalled rank's new dump, once it names where the main thread is: faulthandler
    writes line by line, and a rank descheduled halfway has written a header and no frames."""
    found: dict[int, str] = {}
    deadline = time.monotonic() + DUMP_WAIT_S
    while len(found) < len(offsets) and time.monotonic() < deadline:
        for rank, offset in offsets.items():
            if rank not in found and frames.where(text := _read_from(heartbeats, rank, offset)):
                found[rank] = text
        time.sleep(0.1)
    return found


def _read_from(heartbeats: Path, rank: int, offset: int) -> str:
    """What rank ``rank`` appended to its dumps after ``offset`` (all of it, where a new process
    of the rank started the file afresh). Opened without following a link."""
    try:
        fd = os.open(_dumps(heartbeats, rank), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(offset if offset <= size else 0)
        return handle.read(MAX_DUMP_BYTES).decode("utf-8", "replace")


def _py_spy(pid: int) -> str:
    """py-spy's stacks of ``pid``, with full file names: the user's own frames are told from
    the libraries' by them."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "no stack: py-spy is not installed on this node (pip install py-spy)\n"
    argv = [spy, "dump", "--full-filenames", "--pid", str(pid)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PY_SPY_WAIT_S)
    except subprocess.TimeoutExpired:
        return f"no stack: py-spy did not answer within {PY_SPY_WAIT_S:.0f} s\n"
    return done.stdout or f"no stack: py-spy said {done.stderr.strip()[:300]}\n"


def ranks_here(heartbeats: Path) -> list[Found]:
    """This node's processes that are ranks of the step ``heartbeats`` belongs to: the launcher
    gives each a RANK and a LOCAL_RANK, the batch script the folder, and Slurm the node's name.
    The name matters where nodes share a process table (the local cluster's namespaces do):
    two py-spy attached to one rank at once leave one of them with no stack."""
    wanted = f"{protocol.ENV_HEARTBEAT_DIR}={heartbeats}".encode()
    node = os.environ.get("SLURMD_NODENAME")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        started = start_time(int(proc.name))
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        named = [e for e in environ if e.startswith(b"SLURMD_NODENAME=")]
        if wanted not in environ or named != ([f"SLURMD_NODENAME={node}".encode()] if node else []):
            continue
        rank = next((e[5:] for e in environ if e.startswith(b"RANK=")), b"")
        if rank.isdigit() and any(e.startswith(b"LOCAL_RANK=") for e in environ):
            found.append(Found(int(proc.name), int(rank), started))
    return sorted(found)


if __name__ == "__main__":
    said = take(Path(sys.argv[1]), Path(sys.argv[2]))
    node = os.environ.get("SLURMD_NODENAME", "this node")
    print(f"{node}: " + (", ".join(f"rank {r} {t}" for r, t in sorted(said.items())) or "none"))

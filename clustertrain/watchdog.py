"""Finds a hung job step, names where each rank is stuck, and ends the step.

The batch script starts ``python -m clustertrain.watchdog HEARTBEAT_DIR TIMEOUT_S SRUN_PID``
beside the step. Ranks that call :func:`clustertrain.runtime.heartbeat` keep a file each in
HEARTBEAT_DIR; once no rank has made progress for TIMEOUT_S seconds (a deadlock in a collective,
a stuck data loader, a wedged filesystem: torchrun sees live processes and would wait until the
time limit), the watchdog asks every rank for its stacks (``DUMP_SIGNAL``, which the runtime
library answers with faulthandler, even inside a C call), writes what they say in
``HANG_FILE`` (e.g. ``ranks 0, 2-3 in all_reduce (loop.py:133); rank 1 in step
(train.py:30)``), and ends srun. A step whose ranks never beat is never declared hung.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from clustertrain import events, protocol

# After the dump signal, how long the ranks have to write their stacks; after SIGTERM, how
# long srun has to end the step before SIGKILL.
DUMP_WAIT_S, STOP_WAIT_S = 5.0, 30.0
_BEAT = re.compile(r"rank-(\d+)")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
# Frames of Python itself and of installed packages: the place a rank waits is named by its
# innermost frame, and where in the user's code by the innermost frame outside these.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")


def beats(folder: Path) -> dict[int, tuple[int, float]]:
    """Each rank's newest step and when it wrote it."""
    found = {}
    for path in folder.glob("rank-*"):
        match = _BEAT.fullmatch(path.name)
        if match:
            try:
                found[int(match[1])] = (int(path.read_text().strip() or 0), path.stat().st_mtime)
            except (OSError, ValueError):
                continue
    return found


def where(stack: str) -> str | None:
    """Where a rank's main thread is, from faulthandler's dump: ``func (file.py:N)``."""
    threads = [
        block for block in re.split(r"\n(?=\S)", stack) if "(most recent call first)" in block
    ]
    for block in threads:
        frames = [m.groupdict() for line in block.splitlines() if (m := _FRAME.match(line))]
        if frames and frames[-1]["func"] == "<module>":  # the main thread starts in a module
            user = next((f for f in frames if not _LIBRARY.search(f["file"])), frames[0])
            return f"{frames[0]['func']} ({Path(user['file']).name}:{user['line']})"
    return None


def summary(folder: Path, found: dict[int, tuple[int, float]], quiet_s: float) -> str:
    """One line: how long nothing moved, the newest step, and each group of ranks' place."""
    places: dict[str, list[int]] = {}
    for rank in sorted(found):
        try:
            stack = (folder / f"rank-{rank}.stack").read_text(errors="replace")
        except OSError:
            stack = ""
        places.setdefault(where(stack) or "no stack (it did not answer)", []).append(rank)
    step = max(step for step, _ in found.values())
    said = "; ".join(f"{_ranks(ranks)} in {place}" for place, ranks in places.items())
    return f"hang at step {step}: no rank made progress for {quiet_s:.0f} s; {said}"


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-2, 5``."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][-1] + 1:
            spans[-1].append(rank)
        else:
            spans.append([rank])
    text = ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it ended, and only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def declare(folder: Path, found: dict[int, tuple[int, float]], srun_pid: int) -> str:
    """Ask for the stacks, say where every rank is, end the step; returns what it said."""
    quiet_s = time.time() - max(when for _, when in found.values())
    job = os.environ.get("SLURM_JOB_ID", "")
    signum = int(getattr(signal, f"SIG{protocol.DUMP_SIGNAL}"))
    if job:  # every process of the job's steps; the batch shell is not one
        subprocess.run(["scancel", f"--signal={signum}", job], check=False, timeout=60)
    deadline = time.monotonic() + DUMP_WAIT_S
    while time.monotonic() < deadline and not _all_stacks(folder, found):
        time.sleep(0.2)
    said = summary(folder, found, quiet_s)
    (folder / protocol.HANG_FILE).write_text(said + "\n")
    events.record("hang", step=max(step for step, _ in found.values()), seconds=quiet_s)
    print(f"clustertrain: {said}; stacks in {folder}; ending the step", flush=True)
    _stop(srun_pid)
    return said


def _all_stacks(folder: Path, found: dict[int, tuple[int, float]]) -> bool:
    paths = [folder / f"rank-{rank}.stack" for rank in found]
    return all(path.exists() and path.stat().st_size > 0 for path in paths)


def _stop(pid: int) -> None:
    """End srun (and with it the step's tasks on every node): TERM, then KILL."""
    for signum, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 0.0)):
        if not _alive(pid):
            return
        os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)


def watch(folder: Path, timeout_s: float, srun_pid: int, poll_s: float | None = None) -> None:
    """Until srun ends: declare a hang once the newest heartbeat is ``timeout_s`` old."""
    poll_s = poll_s or min(5.0, timeout_s / 4)
    while _alive(srun_pid):
        found = beats(folder)
        if found and time.time() - max(when for _, when in found.values()) > timeout_s:
            declare(folder, found, srun_pid)
            return
        time.sleep(poll_s)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))

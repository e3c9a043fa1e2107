"""Finds a hung job step, names where each rank is stuck, and ends the step.

The supervisor starts ``python -m clustertrain.node.watchdog HEARTBEAT_DIR TIMEOUT_S SRUN_PID
MODE`` beside the step. Ranks that call :func:`clustertrain.rank.runtime.heartbeat` keep a file
each in HEARTBEAT_DIR; with MODE ``quiet`` (``hang_on_quiet``, for scripts without the runtime
library) the step's output files count as progress too. Once nothing has moved for TIMEOUT_S
seconds (a deadlock in a collective, a stuck data loader, a wedged filesystem: torchrun sees
live processes and would wait until the time limit), the watchdog takes every rank's stacks,
writes where they wait in ``HANG_FILE`` (e.g. ``ranks 0, 2-3 in all_reduce (loop.py:133); rank 1
in step (train.py:30)``), and ends srun. A step that never made progress is never declared hung.

With spare nodes (``protocol.ENV_ACTIVE_NODES`` set), it also watches the nodes' beacons: a
node that goes quiet sends it to the roll call (clustertrain.node.rollcall), and a node that
does not answer is named in ``LOST_FILE`` and the step ended at once, so that the supervisor can
start it again on a spare instead of waiting minutes for Slurm's verdict on the node.

Stacks: ``python -m clustertrain.node.stacks`` runs on every node (an overlapping step), as for
``clustertrain stacks``: ranks with the runtime library write their own through faulthandler on
``DUMP_SIGNAL`` (even inside a C call), py-spy reads the others. Each file says which way it was
taken by its format, and the summary names the tool.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from clustertrain import protocol
from clustertrain.node import beats, frames, rollcall, stacks, straggler
from clustertrain.procs import proc_stat
from clustertrain.rank import events

# How long the stacks may take on every node (a signal, else py-spy: node.stacks); after SIGTERM,
# how long srun has to end the step before SIGKILL.
STACKS_WAIT_S, STOP_WAIT_S = 90.0, 30.0
# A step with a lost node: srun waits for that node's answer, which will not come, and its
# tasks on the other nodes are killed through slurmctld (scancel) meanwhile: a short grace.
LOST_STOP_WAIT_S = 0.3
_STACK = re.compile(r"rank-(\d+)\.stack")


def progress(
    folder: Path, quiet: bool, found: Mapping[int, beats.Beat] | None = None
) -> tuple[dict[int, int], float | None]:
    """Each beating rank's newest step, and when anything last moved: a heartbeat (``found``,
    where this poll read them already), or with ``quiet`` a line of the step's output (the node
    logs beside ``folder``), counted from the first line a rank wrote: the launchers' own lines
    before it are start-up, not progress."""
    found = beats.read(folder) if found is None else found
    times = [beat.time for beat in found.values()]
    if quiet:
        for log in [*sorted(folder.parent.glob("*.out")), *sorted(folder.parent.glob("*.err"))]:
            with contextlib.suppress(OSError):
                if _ranks_wrote(log):
                    times.append(log.stat().st_mtime)
    return {rank: beat.step for rank, beat in found.items()}, max(times, default=None)


def _ranks_wrote(log: Path) -> bool:
    """Whether a node log holds a rank's line (the launcher prefixes them, protocol)."""
    with open(log, "rb") as handle:
        handle.seek(max(0, log.stat().st_size - (64 << 10)))
        tail = handle.read().decode("utf-8", "replace")
    return any(protocol.RANK_PREFIX.match(line) for line in tail.splitlines())


def summary(folder: Path, steps: dict[int, int], quiet_s: float) -> str:
    """One line: how long nothing moved, the newest step, and each group of ranks' place."""
    ranks = set(steps)
    ranks |= {int(m[1]) for p in folder.glob("rank-*.stack") if (m := _STACK.fullmatch(p.name))}
    places: dict[str, list[int]] = {}
    tools: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        try:
            stack = (folder / f"rank-{rank}.stack").read_text(errors="replace")
        except OSError:
            stack = ""
        place = frames.where(stack)
        places.setdefault(place or frames.NO_STACK, []).append(rank)
        if place is not None:
            tools.setdefault(frames.tool(stack), []).append(rank)
    head = f"hang at step {max(steps.values())}" if steps else "hang"
    said = "; ".join(f"{protocol.rank_list(group)} in {place}" for place, group in places.items())
    said = said or "no rank's stack was found"
    taken = ", ".join(f"{tool} for {protocol.rank_list(group)}" for tool, group in tools.items())
    tail = f" (stacks by {taken})" if taken else ""
    return f"{head}: no rank made progress for {quiet_s:.0f} s; {said}{tail}"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it ended, and only waits to be reaped)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def declare(folder: Path, steps: dict[int, int], newest: float, srun_pid: int) -> str:
    """Take the stacks, say where every rank is, end the step; returns what it said."""
    quiet_s = time.time() - newest
    folder.mkdir(parents=True, exist_ok=True)
    _take_stacks(folder)
    said = summary(folder, steps, quiet_s)
    (folder / protocol.HANG_FILE).write_text(said + "\n")
    events.record(events.HANG, step=max(steps.values(), default=0), seconds=quiet_s)
    print(f"clustertrain: {said}; stacks in {folder}; ending the step", flush=True)
    # A node cut off from the others hangs them too: with spares, the restart goes without it.
    if (active := _active_nodes()) and (lost := rollcall.call(active)):
        lose(folder, lost, {node: newest for node in lost}, srun_pid)
    else:
        _stop(srun_pid)
    return said


def lose(folder: Path, lost: dict[str, str], heard: dict[str, float], srun_pid: int) -> None:
    """Name the nodes that did not answer the roll call and end the step now: the batch script
    starts it again on a spare."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / protocol.LOST_FILE).write_text("".join(f"{node}\n" for node in lost))
    since = time.time() - min(heard.get(node, time.time()) for node in lost)
    events.record(events.NODE_LOST, nodes=",".join(lost), seconds=since)
    for node, why in lost.items():
        print(f"clustertrain: {node} is lost: it did not answer the roll call ({why})", flush=True)
    job = os.environ.get("SLURM_JOB_ID", "")
    if job:  # the step's tasks on the healthy nodes: srun cannot end them while it waits
        listed = subprocess.run(
            ["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        steps = [s for s in listed.stdout.split() if s.partition(".")[2].isdigit()]
        if steps:  # not waited for: slurmctld tries the lost node for MessageTimeout first
            subprocess.Popen(["scancel", "--signal=KILL", *steps], stdout=subprocess.DEVNULL)
    _stop(srun_pid, LOST_STOP_WAIT_S)


def _active_nodes() -> list[str]:
    """The nodes the step trains on, where the job holds spares (the batch script's list)."""
    return [node for node in os.environ.get(protocol.ENV_ACTIVE_NODES, "").split(",") if node]


def _take_stacks(folder: Path) -> None:
    """Every rank's stack into ``folder`` (clustertrain.node.stacks): on every node of the step
    beside it (``--overlap``), or here where no Slurm job holds the step (a local run)."""
    if not os.environ.get("SLURM_JOB_ID"):
        stacks.take(folder, folder)
        return
    nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
    argv = ["srun", "--overlap", "--ntasks-per-node=1"]
    if active := _active_nodes():  # the step's nodes, not the spares
        nodes = str(len(active))
        argv.append(f"--nodelist={','.join(active)}")
    argv += [f"--nodes={nodes}", f"--ntasks={nodes}"]
    argv += [sys.executable, "-m", "clustertrain.node.stacks", str(folder), str(folder)]
    with contextlib.suppress(subprocess.TimeoutExpired):  # what was taken by then is kept
        subprocess.run(argv, check=False, timeout=STACKS_WAIT_S, stdout=subprocess.DEVNULL)


def _stop(pid: int, term_wait_s: float = STOP_WAIT_S) -> None:
    """End srun (and with it the step's tasks on every node): TERM, then KILL."""
    for signum, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, 0.0)):
        if not _alive(pid):
            return
        os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)


def watch(
    folder: Path,
    timeout_s: float,
    srun_pid: int,
    quiet: bool = False,
    poll_s: float | None = None,
    stragglers: Stragglers | None = None,
) -> None:
    """Until srun ends: declare a hang once the newest progress is ``timeout_s`` old; with
    spare nodes, end the step as soon as one of its nodes is lost; name stragglers."""
    active, started, next_call = _active_nodes(), time.time(), 0.0
    poll_s = poll_s or min(5.0, timeout_s / 4, *([protocol.BEACON_S / 2] if active else []))
    # Each rank's node, read once (beats.read): the straggler scores' own, where they run.
    nodes: dict[int, str] = stragglers.nodes if stragglers is not None else {}
    while _alive(srun_pid):
        found = beats.read(folder, nodes=nodes)
        if stragglers is not None and stragglers.poll(folder, srun_pid, found):
            return
        steps, newest = progress(folder, quiet, found)
        if newest is not None and time.time() - newest > timeout_s:
            declare(folder, steps, newest, srun_pid)
            return
        if (
            active
            and time.monotonic() >= next_call
            and (heard := rollcall.silent(folder, active, started))
        ):
            if lost := rollcall.call(list(heard)):
                lose(folder, lost, heard, srun_pid)
                return
            next_call = time.monotonic() + rollcall.RECALL_S  # they answered: ask again later
        time.sleep(poll_s)


class Stragglers:
    """The straggler scores of the step (clustertrain.node.straggler), read from the ranks'
    heartbeats at each poll; with ``replace`` and spare nodes, a named straggler is let go at
    the next checkpoint, through the lost node's path (the supervisor starts the step again on
    a spare)."""

    def __init__(self, threshold: float, replace: bool) -> None:
        self.scorer = straggler.Scorer(threshold)
        self.replace = replace and bool(_active_nodes())
        self.pending: tuple[str, float] | None = None  # a straggler to replace, since when
        self.nodes: dict[int, str] = {}

    def poll(
        self, folder: Path, srun_pid: int, found: Mapping[int, beats.Beat] | None = None
    ) -> bool:
        """Read the heartbeats (``found``, where this poll read them already), say what the
        scores say; True once the step was ended."""
        now = time.time()
        found = beats.read(folder, nodes=self.nodes) if found is None else found
        for beat in found.values():
            if beat.node != beats.UNKNOWN:  # no node's name (yet): this rank is not scored
                self.nodes[beat.rank] = beat.node
                self.scorer.add(beat)
        for line in self.scorer.update(now, self.nodes):
            node = line.split()[1]
            events.record(events.STRAGGLER, nodes=node, why=line.partition(": ")[2])
            print(f"clustertrain: {line}", flush=True)
            if self.replace and self.pending is None:
                self.pending = (node, now)
                print(f"clustertrain: {node} is let go at the next checkpoint", flush=True)
        if self.pending is not None and _checkpointed_since(self.pending[1]):
            node = self.pending[0]
            (folder / protocol.LOST_FILE).write_text(f"{node}\n")
            print(f"clustertrain: checkpoint taken; replacing the straggler {node}", flush=True)
            _stop(srun_pid, LOST_STOP_WAIT_S)
            return True
        return False


def _checkpointed_since(when: float) -> bool:
    path = os.environ.get(protocol.ENV_EVENTS_FILE)
    if not path:
        return False
    found = events.scan(Path(path), start=when, max_bytes=1 << 20)[0]
    return any(event.name == events.CHECKPOINT for event in found)


if __name__ == "__main__":
    watched = None
    if len(sys.argv) > 5:  # THRESHOLD warn|replace
        watched = Stragglers(float(sys.argv[5]), sys.argv[6] == "replace")
    watch(
        Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "quiet",
        stragglers=watched,
    )  # fmt: skip

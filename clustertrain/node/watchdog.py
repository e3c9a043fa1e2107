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

Stacks: ranks with the runtime library write their own through faulthandler on
``DUMP_SIGNAL`` (even inside a C call); for the others, ``python -m clustertrain.node.watchdog
dump`` runs on every node (an overlapping step) and takes them with ``py-spy dump``. Each file says
which way it was taken by its format, and the summary names the tool.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from clustertrain import protocol
from clustertrain.node import rollcall, straggler
from clustertrain.procs import proc_stat
from clustertrain.rank import events

# After the dump signal, how long the ranks have to write their stacks; how long py-spy may take
# on every node; after SIGTERM, how long srun has to end the step before SIGKILL.
DUMP_WAIT_S, PY_SPY_WAIT_S, STOP_WAIT_S = 5.0, 60.0, 30.0
# A step with a lost node: srun waits for that node's answer, which will not come, and its
# tasks on the other nodes are killed through slurmctld (scancel) meanwhile: a short grace.
LOST_STOP_WAIT_S = 0.3
_BEAT = re.compile(r"rank-(\d+)")
_STACK = re.compile(r"rank-(\d+)\.stack")
# A frame as faulthandler writes it, and as py-spy does.
_FAULTHANDLER = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
_PY_SPY = re.compile(r"^\s+(?P<func>\S.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
# Frames of Python itself and of installed packages: the place a rank waits is named by its
# innermost frame, and where in the user's code by the innermost frame outside these.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")


def progress(folder: Path, quiet: bool) -> tuple[dict[int, int], float | None]:
    """Each beating rank's newest step, and when anything last moved: a heartbeat, or with
    ``quiet`` a line of the step's output (the node logs beside ``folder``), counted from the
    first line a rank wrote: the launchers' own lines before it are start-up, not progress."""
    steps, newest = {}, None
    files = [(path, _BEAT.fullmatch(path.name)) for path in folder.glob("rank-*")]
    if quiet:
        files += [(path, None) for path in sorted(folder.parent.glob("*.out"))]
        files += [(path, None) for path in sorted(folder.parent.glob("*.err"))]
    for path, rank in files:
        try:
            info = path.stat()
            if rank is not None:
                steps[int(rank[1])] = int((path.read_text().split() or ["0"])[0])
            elif not _ranks_wrote(path):
                continue
        except (OSError, ValueError):
            continue
        newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
    return steps, newest


def _ranks_wrote(log: Path) -> bool:
    """Whether a node log holds a rank's line (the launcher prefixes them, protocol)."""
    with open(log, "rb") as handle:
        handle.seek(max(0, log.stat().st_size - (64 << 10)))
        tail = handle.read().decode("utf-8", "replace")
    return any(protocol.RANK_PREFIX.match(line) for line in tail.splitlines())


def where(stack: str) -> str | None:
    """Where a rank's main thread is, from faulthandler's dump or py-spy's: ``func (file:N)``."""
    for block in re.split(r"\n(?=\S)", stack):
        frames = [
            m.groupdict()
            for line in block.splitlines()
            if (m := _FAULTHANDLER.match(line) or _PY_SPY.match(line))
        ]
        # faulthandler writes no thread names: the main thread is the one that starts in a module.
        # Under `python -m`, runpy's frames sit below the module's: any <module> frame will do.
        if frames and (any(f["func"] == "<module>" for f in frames) or '"MainThread"' in block):
            user = next((f for f in frames if not _LIBRARY.search(f["file"])), frames[0])
            return f"{frames[0]['func']} ({Path(user['file']).name}:{user['line']})"
    return None


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
        place = where(stack)
        places.setdefault(place or "no stack (it did not answer)", []).append(rank)
        if place is not None:
            tool = "py-spy" if stack.startswith("Process ") else "faulthandler"
            tools.setdefault(tool, []).append(rank)
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
    job = os.environ.get("SLURM_JOB_ID", "")
    signum = int(getattr(signal, f"SIG{protocol.DUMP_SIGNAL}"))
    if job:  # every process of the job's steps; the batch shell is not one
        subprocess.run(["scancel", f"--signal={signum}", job], check=False, timeout=60)
    deadline = time.monotonic() + DUMP_WAIT_S
    while steps and time.monotonic() < deadline and not _all_stacks(folder, steps):
        time.sleep(0.2)
    if job and not (steps and _all_stacks(folder, steps)):
        _py_spy_on_every_node(folder)
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


def _all_stacks(folder: Path, steps: dict[int, int]) -> bool:
    """Whether every rank's stack names where its main thread is. Not merely a file that is not
    empty: faulthandler writes a dump line by line, and a rank descheduled halfway through has
    written its header and none of its frames yet (a busy host showed it: "no stack")."""
    for rank in steps:
        try:
            stack = (folder / f"rank-{rank}.stack").read_text(errors="replace")
        except OSError:
            return False
        if where(stack) is None:
            return False
    return True


def _py_spy_on_every_node(folder: Path) -> None:
    """``dump`` on every node of the job, beside the hung step (``--overlap``)."""
    nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
    argv = ["srun", "--overlap", "--ntasks-per-node=1"]
    if active := _active_nodes():  # the step's nodes, not the spares
        nodes = str(len(active))
        argv.append(f"--nodelist={','.join(active)}")
    argv += [f"--nodes={nodes}", f"--ntasks={nodes}"]
    argv += [sys.executable, "-m", "clustertrain.node.watchdog", "dump", str(folder)]
    with contextlib.suppress(subprocess.TimeoutExpired):  # what was taken by then is kept
        subprocess.run(argv, check=False, timeout=PY_SPY_WAIT_S, stdout=subprocess.DEVNULL)


def dump(folder: Path) -> None:
    """On one node: py-spy's stacks of this job's ranks here that did not write their own."""
    spy = shutil.which("py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    for pid, rank in _ranks_here(folder):
        out = folder / f"rank-{rank}.stack"
        if out.exists() and out.stat().st_size > 0:
            continue
        if spy is None:
            out.write_text("no stack: py-spy is not installed on this node (pip install py-spy)\n")
            continue
        out.write_text(_py_spy(spy, pid))


def _py_spy(spy: str, pid: str) -> str:
    """py-spy's stacks of ``pid``, with full file names: the user's own frames are told from
    the libraries' by them."""
    argv = [spy, "dump", "--full-filenames", "--pid", pid]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.stdout or f"no stack: py-spy said {done.stderr.strip()[:300]}\n"


def _ranks_here(folder: Path) -> list[tuple[str, int]]:
    """(pid, rank) of this node's processes that are ranks of the step ``folder`` belongs to:
    the launcher gives each a RANK and a LOCAL_RANK, the batch script the folder, and Slurm the
    node's name. The name matters where nodes share a process table (the local cluster's
    namespaces do): two py-spy attached to one rank at once leave one of them with no stack."""
    wanted = f"{protocol.ENV_HEARTBEAT_DIR}={folder}".encode()
    node = f"SLURMD_NODENAME={os.environ.get('SLURMD_NODENAME', '')}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((e[5:] for e in environ if e.startswith(b"RANK=")), b"")
        ours = wanted in environ and node in environ
        if ours and rank.isdigit() and any(e.startswith(b"LOCAL_RANK=") for e in environ):
            found.append((proc.name, int(rank)))
    return found


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
    while _alive(srun_pid):
        if stragglers is not None and stragglers.poll(folder, srun_pid):
            return
        steps, newest = progress(folder, quiet)
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

    def poll(self, folder: Path, srun_pid: int) -> bool:
        """Read the heartbeats, say what the scores say; True once the step was ended."""
        now = time.time()
        for path in folder.glob("rank-*"):
            if not (match := _BEAT.fullmatch(path.name)):
                continue
            rank = int(match[1])
            with contextlib.suppress(OSError, ValueError, IndexError):
                if rank not in self.nodes:
                    node = (folder / f"rank-{rank}.node").read_text(errors="replace").strip()
                    if not protocol.NODE_NAME.fullmatch(node):
                        continue  # not a node's name: this rank is not scored
                    self.nodes[rank] = node
                step, total = path.read_text().split()[:2]
                self.scorer.add(rank, straggler.Beat(path.stat().st_mtime, int(step), float(total)))
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
    if sys.argv[1] == "dump":
        dump(Path(sys.argv[2]))
    else:
        watched = None
        if len(sys.argv) > 5:  # THRESHOLD warn|replace
            watched = Stragglers(float(sys.argv[5]), sys.argv[6] == "replace")
        watch(
            Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "quiet",
            stragglers=watched,
        )  # fmt: skip

"""What one writer's last lines say of how it ended (a rank's, or its launcher's): the kinds of
failure, and a matcher for each, pure: lines in, a :class:`Finding` out.

:mod:`clustertrain.runs.why` weighs the findings of every rank against each other and against
what Slurm said; here each line is read alone, in the words the thing that failed wrote: Python's
exception line and traceback frames, torch's ``CUDA out of memory``, NCCL's ``NCCL error`` and
its watchdog, the C++ runtime's ``terminate called ...``, faulthandler's ``Fatal Python error``.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import PurePosixPath

from clustertrain.runs import fold


class Kind(str, Enum):
    """Each way a job ends that ``status`` names, with its own headline and hint."""

    EXCEPTION = "exception"  # a Python exception (or a script's own "error: ...") in user code
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"  # the kernel's or the cgroup's OOM killer
    SIGNAL = "signal"  # SIGSEGV, SIGABRT, SIGBUS, SIGKILL...
    COLLECTIVE = "collective"  # an NCCL or gloo error, or a collective that timed out
    RENDEZVOUS = "rendezvous"  # the process group never formed
    NOT_IMPORTABLE = "not_importable"
    MISSING_DATA = "missing_data"
    DISK_FULL = "disk_full"
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    CANCELLED = "cancelled"
    HANG = "hang"  # the watchdog's verdict (clustertrain.node.watchdog)
    SETUP = "setup"  # one of the job's setup lines failed, before any rank
    DIED_AT_EXIT = "died_at_exit"  # training finished, then a rank crashed in teardown
    RESTART_STORM = "restart_storm"  # restarts that never got past the last checkpoint
    NO_RESTART = "no_restart"  # a rank exited with protocol.NO_RESTART_EXIT
    UNKNOWN = "unknown"


# How strongly a finding names the job's cause, strongest first: what a rank did itself, an
# error in a collective (a peer's death often reads as one), a collective that waited too long
# for a rank elsewhere, a signal, and what only follows from a peer's failure.
OWN, COLLECTIVE_ERROR, TIMED_OUT, SIGNALLED, CONSEQUENCE = range(5)
# Of two findings of one weight in one rank's lines, the more specific kind names the cause (a
# FileNotFoundError under a RuntimeError that wraps it).
_SPECIFIC = (
    Kind.CUDA_OOM, Kind.DISK_FULL, Kind.NOT_IMPORTABLE, Kind.MISSING_DATA, Kind.RENDEZVOUS,
    Kind.COLLECTIVE, Kind.SIGNAL, Kind.EXCEPTION,
)  # fmt: skip


@dataclass(frozen=True)
class Cause:
    """Why a job failed: its ``kind``, the ranks and node involved, a one-line ``headline``,
    the ``decisive`` line (escaped), a ``hint`` (what to do) and the ``evidence`` (the decisive
    lines of each rank involved, escaped, at most :data:`clustertrain.runs.why.MAX_EVIDENCE`)."""

    kind: Kind
    headline: str
    hint: str
    ranks: tuple[int, ...] = ()
    node: str | None = None
    decisive: str = ""
    evidence: tuple[str, ...] = ()

    @property
    def rank(self) -> int | None:
        return self.ranks[0] if self.ranks else None

    def lines(self) -> list[str]:
        """What ``status`` prints of it: the headline, then the hint."""
        return [self.headline, f"hint: {self.hint}"]


@dataclass(frozen=True)
class Finding:
    """How one writer ended, as its lines say: the ``kind``, its ``weight`` (above), the
    decisive ``line`` as written (escape it to show it), what a headline quotes of it
    (``detail``), the last traceback frame in the user's code (``where``: ``train.py:88``), the
    ``signal`` that ended it, and whether it died after its Python code had ended (``at_exit``)."""

    kind: Kind
    weight: int
    line: str
    detail: str = ""
    where: str | None = None
    signal: int | None = None
    at_exit: bool = False


_FRAME = re.compile(r'^\s*File "([^"]{1,500})", line (\d{1,9}),? in \S')
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]{0,200}(?:Error|Exception|Exit|Interrupt))(?::\s?(.*))?$")
_SCRIPT_ERROR = re.compile(r"^error: \S")
_CUDA_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory")
_ALLOCATE = re.compile(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)")
_GPU = re.compile(r"\((GPU \d+)[;)]|\b(GPU \d+) has a total capacity of ([\d.]+ ?[KMGT]?i?B)")
_DISK_FULL = re.compile(
    r"No space left on device|\bENOSPC\b|\[Errno 28\]|PytorchStreamWriter failed writing"
)
_NO_MODULE = re.compile(r"No module named '?([\w.]{1,200})'?")
_CANT_OPEN = re.compile(r"can't open file '([^']{0,500})'")
_MODULE_SPEC = "Error while finding module specification for"
_CANNOT_IMPORT = re.compile(r"^ImportError: ")
_MISSING = re.compile(r"FileNotFoundError|No such file or directory")
_MISSING_WORDS = re.compile(r"\b(?:not found|does not exist|is not in|missing)\b")
_RENDEZVOUS = re.compile(
    r"RendezvousTimeoutError|RendezvousError|EADDRINUSE|[Aa]ddress already in use|"
    r"The client socket has timed out after"
)
_NCCL_ERROR = re.compile(
    r"NCCL error(?: in: \S+?,|:)? ?(.+?)(?: \(run with NCCL_DEBUG|, NCCL version|$)"
)
# NCCL's own words below torch's ("ncclSystemError: System call ... failed").
_NCCL_NAMED = re.compile(r"^nccl\w*Error: ")
_NCCL_VERSION = re.compile(r"NCCL version ([\d.]+)")
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\((.*?)\) ran for (\d+) milliseconds"
)
_OP = re.compile(r"OpType=(\w+)")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+) ?ms for (\w+) operation to complete")
_TERMINATE = re.compile(
    r"terminate called (?:after throwing an instance of '([^']{1,200})'|"
    r"without an active exception|recursively)"
)
_FATAL = re.compile(r"Fatal Python error: (Segmentation fault|Bus error|Aborted|Floating point)")
_FATAL_SIGNALS = {"Segmentation fault": 11, "Bus error": 7, "Aborted": 6, "Floating point": 8}
_FINALIZING = "Python runtime state: finalizing"
# A peer's failure as the ranks that survive it say it, and the launchers' own reports of the
# stop that follows: never the cause while a rank says more.
_CONSEQUENCE = re.compile(
    fold.PEER_FAILED.pattern + r"|remote process exited|RendezvousConnectionError|"
    r"RendezvousClosedError|Broken pipe|Failed to recv"
)
# A launcher's report of its ranks' end, and of its own stop: the ranks' exit codes say that.
_LAUNCHER_REPORT = re.compile(r"ChildFailedError|SignalException")


# Slurm's words in the batch shell's stderr: slurmstepd's end of a job or step, and the OOM
# killer's kills as slurmstepd and srun report them.
SLURM_END = re.compile(
    r"\*\*\* (JOB|STEP) (\S+) ON (\S+) CANCELLED(?: AT (\S+))?(?: DUE TO ([A-Z ]+?))?"
    r"(?:, [^*]{0,80})? \*\*\*"
)
OOM_KILLS = re.compile(r"Detected \d+ oom[-_]kill events?")
OOM_KILL = re.compile(OOM_KILLS.pattern + r"|: tasks? [\d,-]+: Out Of Memory")
OOM_NODE = re.compile(r"srun: error: (\S+): tasks? [\d,-]+: Out Of Memory")


# What each signal that ends a rank usually means, and what to do about it.
SIGNALS: dict[int, tuple[str, str]] = {
    signals.SIGSEGV.value: (
        "a segmentation fault",
        "a crash in native code (a C extension, a CUDA "
        "library, the driver): PYTHONFAULTHANDLER=1 in env prints the Python "
        "stack; check that torch and its extensions were built for this CUDA",
    ),
    signals.SIGABRT.value: (
        "an abort",
        "native code aborted (a C++ exception nobody caught): the line quoted says which",
    ),
    signals.SIGBUS.value: (
        "a bus error",
        "usually /dev/shm too small for the data loader's workers "
        "(fewer num_workers, or a larger /dev/shm from your site), or a memory-"
        "mapped file truncated under the job",
    ),
    signals.SIGKILL.value: (
        "killed without warning",
        "SIGKILL comes from the kernel's out-of-memory "
        "killer (Slurm's accounting says OUT_OF_MEMORY where it keeps one; compare "
        "MaxRSS with the memory asked for), from Slurm once KillWait passed, or "
        "from a user",
    ),
    signals.SIGFPE.value: (
        "a floating-point exception",
        "an integer division by zero in native code",
    ),
}


def signal_name(number: int) -> str:
    """``SIGSEGV``; ``signal 77`` for a number that names none."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def where(lines: list[str], upto: int) -> str | None:
    """``train.py:88``: the last frame above line ``upto`` of the traceback it ends that is in
    the user's code, not in a library's (site-packages, the standard library)."""
    for line in reversed(lines[max(0, upto - 200) : upto]):
        if line == fold.TRACEBACK:
            break
        frame = _FRAME.match(line)
        if frame and not _LIBRARY.search(frame[1]):
            return f"{PurePosixPath(frame[1]).name}:{frame[2]}"
    return None


def _fault_frame(lines: list[str], after: int) -> str | None:
    """faulthandler's frames follow its "Fatal Python error", the newest first."""
    for line in lines[after + 1 : after + 40]:
        frame = _FRAME.match(line)
        if frame and not _LIBRARY.search(frame[1]):
            return f"{PurePosixPath(frame[1]).name}:{frame[2]}"
    return None


def _error_line(line: str) -> bool:
    return bool(_EXCEPTION.match(line) or _SCRIPT_ERROR.match(line))


def _anywhere(line: str) -> Finding | None:
    """What a line says wherever it stands (not only as an exception's line)."""
    if _CUDA_OOM.search(line):
        size, gpu = _ALLOCATE.search(line), _GPU.search(line)
        said = [f"tried to allocate {size[1]}"] if size else []
        said += [f"on {gpu[1] or gpu[2]}"] if gpu else []
        return Finding(Kind.CUDA_OOM, OWN, line, " ".join(said))
    if _DISK_FULL.search(line):
        return Finding(Kind.DISK_FULL, OWN, line, "No space left on device")
    if opened := _CANT_OPEN.search(line):
        return Finding(Kind.NOT_IMPORTABLE, OWN, line, f"the job's script: can't open file "
                       f"'{opened[1]}'")  # fmt: skip
    if _MODULE_SPEC in line or (not _error_line(line) and _NO_MODULE.search(line)):
        module = _NO_MODULE.search(line)
        name = f": No module named {module[1]}" if module else ""
        return Finding(Kind.NOT_IMPORTABLE, OWN, line, f"the job's module{name}")
    if watchdog := _WATCHDOG.search(line):
        op = _OP.search(watchdog[1])
        seconds = int(watchdog[2]) // 1000
        what = f"{op[1] if op else 'a collective'} waited {seconds} s (NCCL's watchdog)"
        return Finding(Kind.COLLECTIVE, TIMED_OUT, line, what)
    if gloo := _GLOO_TIMEOUT.search(line):
        what = f"a gloo {gloo[2]} waited {int(gloo[1]) // 1000} s"
        return Finding(Kind.COLLECTIVE, TIMED_OUT, line, what)
    if _RENDEZVOUS.search(line):
        return Finding(Kind.RENDEZVOUS, OWN, line, line)
    if nccl := _NCCL_ERROR.search(line):
        version = _NCCL_VERSION.search(line)
        what = nccl[1].rstrip(".,") + (f" (NCCL {version[1]})" if version else "")
        weight = CONSEQUENCE if _CONSEQUENCE.search(line) else COLLECTIVE_ERROR
        return Finding(Kind.COLLECTIVE, weight, line, what)
    if terminate := _TERMINATE.search(line):
        what = f"terminate called after throwing {terminate[1]}" if terminate[1] else line.strip()
        return Finding(Kind.SIGNAL, SIGNALLED, line, what, signal=6)
    if fatal := _FATAL.search(line):
        return Finding(Kind.SIGNAL, SIGNALLED, line, line.strip(), signal=_FATAL_SIGNALS[fatal[1]])
    return None


def _as_error(line: str) -> Finding | None:
    """What an exception's line (``ValueError: boom``) or a script's ``error: ...`` says."""
    if not _error_line(line) or _LAUNCHER_REPORT.search(line):
        return None
    if _CONSEQUENCE.search(line):
        return Finding(Kind.COLLECTIVE, CONSEQUENCE, line, line)
    if module := _NO_MODULE.search(line):
        return Finding(Kind.NOT_IMPORTABLE, OWN, line, f"No module named '{module[1]}'")
    if _CANNOT_IMPORT.match(line):
        return Finding(Kind.NOT_IMPORTABLE, OWN, line, line.removeprefix("ImportError: "))
    if _MISSING.search(line) or ("/" in line and _MISSING_WORDS.search(line)):
        return Finding(Kind.MISSING_DATA, OWN, line, line)
    return Finding(Kind.EXCEPTION, OWN, line, line)


def classify(lines: list[str]) -> Finding | None:
    """How the writer of ``lines`` (one rank's, in order) ended, as far as its lines say: the
    strongest finding, of the most specific kind, the latest of those; None where they say
    nothing of an end."""
    best: tuple[tuple[int, int, int], Finding] | None = None
    tailer = False  # inside the traceback of torchelastic's log tailer: a consequence
    for at, line in enumerate(lines):
        if fold.LOG_TAILER.search(line) or tailer:
            tailer = not (line and line[0] not in " \t" and _error_line(line))
            continue
        if _NCCL_NAMED.match(line):
            continue  # NCCL's own words restate torch's line above them
        found = _anywhere(line) or _as_error(line)
        if found is None:
            continue
        if found.kind is Kind.SIGNAL and _FATAL.search(line):
            tail = lines[at + 1 : at + 40]
            found = replace(found, where=_fault_frame(lines, at), at_exit=_FINALIZING in tail)
        elif found.kind is Kind.SIGNAL:
            found = replace(found, at_exit=fold.TRACEBACK not in lines[:at])
        elif found.where is None:
            found = replace(found, where=where(lines, at))
        key = (found.weight, _SPECIFIC.index(found.kind), -at)
        if best is None or key < best[0]:
            best = (key, found)
    return best[1] if best else None

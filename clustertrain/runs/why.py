"""Why a job failed, said once: :func:`cause` is a pure function from a run's records
(:class:`Records`) to a typed :class:`Cause`, its headline one line; :func:`read` gathers those
records from a run folder, reading the tails of its logs only. ``status``, the API
(``Job.failure``) and every other surface ask it, never the logs themselves.

The records are weighed in this order: what Slurm decided (a time limit, a preemption, a lost
node, the OOM killer, a cancel), then a failed setup line, then the supervisor's end without a
restart (a rank that exited with protocol.NO_RESTART_EXIT, a restart storm), then what a rank
did itself (a Python exception, CUDA out of memory, a full disk, missing data, a module it could
not import, an NCCL error), then the watchdog's hang, a collective that timed out, a signal, a
lost node, and last what only follows a peer's failure (gloo's "Connection closed by peer"): a
consequence is never the cause while another rank says more. Each writer's lines are read by
:mod:`clustertrain.runs.why_kinds`. Everything quoted from a run folder is shown escaped.
"""

from __future__ import annotations

import pwd
import signal as signals
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.files import RunFolderError, printable, read_regular
from clustertrain.jobstate import RUN_FOLDER, TERMINAL_STATES, Accounting, JobState
from clustertrain.rank import events
from clustertrain.rank.events import Event
from clustertrain.runs import bars, logs, timeline
from clustertrain.runs.folder import Run
from clustertrain.runs.why_kinds import (
    COLLECTIVE_ERROR,
    CONSEQUENCE,
    OOM_KILL,
    OOM_NODE,
    SIGNALLED,
    SLURM_END,
    Cause,
    Finding,
    Kind,
    classify,
    signal_name,
)
from clustertrain.runs.why_records import End, Exit, Records, Tail
from clustertrain.runs.why_texts import build

__all__ = ["Cause", "Exit", "Kind", "Records", "Tail", "cause", "read"]

MAX_EVIDENCE = 20
_TAIL_BYTES = 256 << 10  # of each node's stderr: the end is where a failure is reported
_TAIL_LINES = 200  # of each writer (rank or launcher) in it
_LINE_CHARS = 2000
_MAX_WORLD = 1 << 16  # a job.json's world size beyond this is not believed


def _merge(found: Finding | None, said: Exit | None) -> Finding | None:
    """A writer's finding, with the signal its launcher's report says ended it."""
    if said is None or said.exit_code >= 0:
        return found
    number = -said.exit_code
    if found is not None and found.kind is Kind.SIGNAL:
        return replace(found, signal=number)
    # SIGTERM is the launcher's own stop of the ranks that outlived a failed one.
    weight = CONSEQUENCE if number == signals.SIGTERM else SIGNALLED
    if found is not None and found.weight <= weight:
        return found
    line = f"exitcode {said.exit_code} ({signal_name(number)}), as its launcher reported"
    return Finding(Kind.SIGNAL, weight, line, signal=number)


def ends(records: Records) -> list[End]:
    """Every writer that says how it ended, the likeliest cause of the job's failure first:
    by weight, then the launchers' reports (the first observed failure, a rank killed by a
    signal before one that exited), then rank."""
    reports = {(e.node, e.rank): e for e in records.exits}
    found: list[End] = []
    for tail in records.tails:
        said = reports.pop((tail.node, tail.rank), None) if tail.rank is not None else None
        finding = _merge(classify(list(tail.lines)), said)
        if finding is not None:
            found.append(End(tail.node, tail.rank, tail.local, finding, tail.lines, said))
    for said in reports.values():  # a rank that wrote nothing before its end
        if (finding := _merge(None, said)) is not None:
            found.append(End(said.node, said.rank, None, finding, (), said))

    def suspicion(end: End) -> tuple[int, str, bool, int]:
        when = end.exit.time if end.exit is not None and end.exit.time else "~"
        killed = end.exit is not None and end.exit.exit_code < 0
        return (end.finding.weight, when, not killed, end.rank if end.rank is not None else 1 << 30)

    return sorted(found, key=suspicion)


def cause(records: Records) -> Cause | None:
    """Why the job of ``records`` did not complete; None while it runs, or once it completed.
    Never raises: what is not understood reads "cause unknown: ..." with what is known."""
    if records.state not in TERMINAL_STATES or records.state == "COMPLETED":
        return None
    found = ends(records)
    decided = (
        _scheduler(records, found)
        or (build(Kind.SETUP, records) if records.setup else None)
        or _asked(records, found)
        or (_storm(records, found) if records.storm else None)
        or _ranks(records, found, COLLECTIVE_ERROR)
        or (build(Kind.HANG, records) if records.hang else None)
        or _ranks(records, found, SIGNALLED)
        or (build(Kind.NODE_LOST, records) if records.lost_nodes else None)
        or _ranks(records, found, CONSEQUENCE)
        or build(Kind.UNKNOWN, records)
    )
    return _clipped(decided)


def _scheduler(records: Records, found: list[End]) -> Cause | None:
    """What Slurm decided: its state, accounting, and slurmstepd's and srun's words."""
    text = "\n".join(records.batch)
    # The batch log holds every attempt's words: where Slurm itself says how the job ended,
    # slurmstepd's "DUE TO" of an earlier attempt (a preemption since requeued) is not this end.
    ends_said = [m for m in SLURM_END.finditer(text)] if records.source == RUN_FOLDER else []
    dues = {m[5] for m in ends_said if m[5]}
    job_cancelled = any(m[1] == "JOB" and not m[5] for m in ends_said)
    accounted = records.accounting
    oom_steps = accounted is not None and any(s.state == "OUT_OF_MEMORY" for s in accounted.steps)
    state = records.state
    if state == "TIMEOUT" or "TIME LIMIT" in dues:
        return build(Kind.TIME_LIMIT, records)
    if state == "PREEMPTED" or "PREEMPTION" in dues:
        return build(Kind.PREEMPTED, records)
    if state == "NODE_FAIL" or "NODE FAILURE" in dues:
        return build(Kind.NODE_LOST, records)
    if state == "OUT_OF_MEMORY" or oom_steps or OOM_KILL.search(text):
        killed = next((e for e in found if e.finding.signal == signals.SIGKILL), None)
        oom_node = OOM_NODE.search(text)
        return build(Kind.HOST_OOM, records, killed, found, oom_node[1] if oom_node else None)
    if state == "CANCELLED" or job_cancelled:
        return build(Kind.CANCELLED, records)
    return None


def _asked(records: Records, found: list[End]) -> Cause | None:
    """A rank that exited with protocol.NO_RESTART_EXIT, as the supervisor's event or (a run
    without one) its launcher's report says; its own decisive line, where it wrote one."""
    said = records.no_restart or next(
        ((e.rank, e.node) for e in records.exits if e.exit_code == protocol.NO_RESTART_EXIT), None
    )
    if said is None:
        return None
    rank, node = said
    own = next((e for e in found if (e.rank, e.node) == (rank, node)), None)
    return build(Kind.NO_RESTART, replace(records, no_restart=said), own, found, node)


def _storm(records: Records, found: list[End]) -> Cause:
    """A restart storm: the likeliest rank's finding is what failed each time."""
    return build(Kind.RESTART_STORM, records, next(iter(found), None), found)


def _ranks(records: Records, found: list[End], weakest: int) -> Cause | None:
    """The likeliest rank's finding, if it weighs at least ``weakest``: a finished rank that
    crashed at exit while no other rank said a word is training that completed."""
    best = next((end for end in found if end.finding.weight <= weakest), None)
    if best is None:
        return None
    others = [
        e for e in found if e is not best and (e.rank is not None or e.finding.weight < CONSEQUENCE)
    ]
    if best.finding.kind is Kind.SIGNAL and best.finding.at_exit and not others:
        return build(Kind.DIED_AT_EXIT, records, best, found)
    return build(best.finding.kind, records, best, found)


def _clipped(found: Cause) -> Cause:
    """Every text of a cause one printable line each, and the evidence MAX_EVIDENCE lines."""
    return replace(
        found,
        headline=printable(found.headline)[:400],
        hint=printable(found.hint)[:400],
        decisive=printable(found.decisive)[:400],
        evidence=tuple(printable(line)[:300] for line in found.evidence[:MAX_EVIDENCE]),
    )


def read(
    run: Run,
    state: JobState,
    accounting: Accounting | None = None,
    found: list[Event] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Records:
    """``run``'s records as :func:`cause` reads them, given its ``state`` and ``accounting``
    (and its events, when already read): the tails of its logs only, each read bounded and
    never through a symlink."""
    found = run.events(warn) if found is None else found
    tails, exits, nodes = _node_tails(run)
    batch = _lines(run, run.logs_dir / f"slurm-{run.job_id}.err")
    launchers = (t.lines for t in tails if t.rank is None and t.local is None)
    ended = [e for e in found if e.name == events.ENDED]
    newest = max((e.attempt for e in found), default=0)
    storm = [e.values for e in found if e.name == events.RESTART_STORM and e.attempt == newest]
    asked = [e.values for e in found if e.name == events.NO_RESTART and e.attempt == newest]
    headline = timeline.headline(found, run.metric)
    by = accounting.cancelled_by if accounting is not None else ""
    return Records(
        job_id=run.job_id,
        state=state.state.rstrip("+"),  # sacct's CANCELLED+
        source=state.source,
        reason=state.reason,
        exit_code=state.exit_code,
        elapsed=state.elapsed,
        tails=tuple(tails),
        exits=tuple(exits),
        nodes=tuple(nodes),
        world_size=run.world_size if 0 < run.world_size <= _MAX_WORLD else 0,
        batch=tuple(batch),
        accounting=accounting,
        hang=logs.hang(run),
        lost_nodes=lost_nodes(run, accounting),
        # The batch script's setup lines run first; a node's (node_setup) in its launch script.
        setup=logs.setup_line(batch) or next(filter(None, map(logs.setup_line, launchers)), None),
        ended=str(ended[-1].values.get("status", "")) if ended else None,
        requeues=sum(e.name == events.REQUEUED for e in found),
        last_metric=headline.text() if headline else None,
        cancelled_by=_user(by) if by else None,
        storm=(int(storm[-1].get("restarts", 0)), str(storm[-1].get("why", ""))) if storm else None,
        no_restart=_rank_on(asked[-1]) if asked else None,
    )


def lost_nodes(run: Run, accounting: Accounting | None) -> tuple[str, ...]:
    """The nodes Slurm declared lost: srun's words, and accounting's record (srun may be stopped
    before it is told)."""
    kept = accounting.lost_nodes if accounting is not None else ()
    return tuple(dict.fromkeys([*logs.lost_nodes(run), *kept]))


def _rank_on(values: dict[str, Any]) -> tuple[int, str] | None:
    """The rank and node of a no_restart event (a run folder is anyone's: both checked)."""
    rank, node = values.get("rank"), values.get("nodes")
    if isinstance(rank, int | float) and 0 <= rank < _MAX_WORLD and isinstance(node, str):
        return int(rank), node
    return None


def _node_tails(run: Run) -> tuple[list[Tail], list[Exit], list[str]]:
    """Each writer's last lines in every node's stderr of the newest attempt, the launchers'
    reports, and the nodes."""
    files = [log for log in logs.log_files(run) if log.node != "batch" and log.stream == "err"]
    newest = max((log.attempt for log in files), default=0)
    tails: list[Tail] = []
    exits: list[Exit] = []
    nodes: list[str] = []
    for log in (log for log in files if log.attempt == newest):
        nodes.append(log.node)
        lines = _lines(run, log.path)
        writers: dict[tuple[int | None, int | None], list[str]] = {}
        for said in bars.writers_lines(lines):
            if not bars.is_bar(said.text):  # progress, never a failure's evidence
                writers.setdefault((said.rank, said.local), []).append(said.text)
        report = logs.root_cause(lines)
        if report is not None:
            rank, local = int(report["rank"][0]), int(report["rank"][1])
            exits.append(Exit(log.node, rank, int(report["exit"][0]), report["time"][0]))
            exits += [e for e in _other_failures(lines, log.node) if e.rank != rank]
            if (None, local) in writers and (rank, None) not in writers:  # torch 1.x
                writers[(rank, local)] = writers.pop((None, local))
        tails += [Tail(log.node, r, tuple(t[-_TAIL_LINES:]), lo) for (r, lo), t in writers.items()]
    return tails, exits, nodes


def _other_failures(lines: list[str], node: str) -> list[Exit]:
    """The ranks the last failure report of ``lines`` lists besides its root cause: those its
    launcher stopped, or that failed after the first, between its "Failures:" and its root
    cause, a field a line."""
    found: list[Exit] = []
    inside, rank = False, None
    for line in lines:
        if line.startswith(protocol.REPORT_FAILURES) or protocol.REPORT_ROOT in line:
            inside, rank = line.startswith(protocol.REPORT_FAILURES), None
            found = [] if inside else found
        elif inside and (match := protocol.REPORT_RANK.search(line)):
            rank = int(match[1])
        elif inside and rank is not None and (match := protocol.REPORT_EXIT.search(line)):
            found.append(Exit(node, rank, int(match[1])))
            rank = None
    return found


def _lines(run: Run, path: Path) -> list[str]:
    """The last lines of a log (a bounded tail; each line cut to _LINE_CHARS)."""
    try:
        data = read_regular(path, _TAIL_BYTES, True, run.folder)
    except RunFolderError:
        return []
    return [line[:_LINE_CHARS] for line in data.decode("utf-8", "replace").splitlines()]


def _user(uid: str) -> str:
    """``alice (uid 1000)``, as sacct's "CANCELLED by 1000" names who cancelled."""
    try:
        return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError, OverflowError):
        return f"uid {uid}"

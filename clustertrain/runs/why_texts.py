"""What :mod:`clustertrain.runs.why` says of each kind of failure: its headline (one line: what
happened, where) and its hint (what to do), with the evidence behind them. Pure: records and
the ends of the ranks in, a :class:`~clustertrain.runs.why_kinds.Cause` out. Texts read from a
run folder are quoted here as written; ``why`` escapes every text of a cause once, at the end.
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustertrain import protocol
from clustertrain.jobstate import LOCAL
from clustertrain.runs.timeline import duration
from clustertrain.runs.why_kinds import (
    CONSEQUENCE,
    OOM_KILL,
    OOM_KILLS,
    SIGNALS,
    SLURM_END,
    TIMED_OUT,
    Cause,
    Kind,
    signal_name,
)

if TYPE_CHECKING:
    from clustertrain.runs.why_records import End, Records

_QUOTE = 240
_OWN_LINES = 8  # of the deciding rank's lines up to its decisive one
_OTHERS = 8  # other ranks, a line each


def _quote(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def _at(where: str | None) -> str:
    """`` (train.py:88)``: where in the user's code, after a headline's quote."""
    return f" ({where})" if where else ""


def _logs(records: Records, end: End | None) -> str:
    """The ``logs`` command that shows ``end``'s errors."""
    pick = ""
    if end is not None:
        pick = f" --rank {end.rank}" if end.rank is not None else f" --node {end.node}"
    return f"`clustertrain logs {records.job_id}{pick} --errors`"


def evidence(records: Records, end: End | None, found: Sequence[End]) -> tuple[str, ...]:
    """The deciding writer's lines up to its decisive one, a line for each other writer that
    said something, and Slurm's words of the end."""
    said: list[str] = []
    if end is not None and end.finding.line in end.lines:
        at = len(end.lines) - 1 - end.lines[::-1].index(end.finding.line)
        said += [
            f"{end.label()} ! {line}" for line in end.lines[max(0, at - _OWN_LINES + 1) : at + 1]
        ]
    elif end is not None:
        said.append(f"{end.label()}: {end.finding.line}")
    others = [e for e in found if e is not end]
    own = [e for e in others if e.finding.weight < CONSEQUENCE][:_OTHERS]
    said += [f"{e.label()}: {_quote(e.finding.line)}" for e in own]
    said += _consequences([e for e in others if e.finding.weight >= CONSEQUENCE])
    slurm = [line for line in records.batch if _SLURM_SAID.search(line)]
    return tuple(said + [f"batch ! {line}" for line in slurm[-4:]])


def _consequences(found: Sequence[End]) -> list[str]:
    """What only followed the first failure (a lost peer, a launcher stopped), folded to one
    line: who said it, and the first of their words."""
    if not found:
        return []
    ranks = [e.rank for e in found if e.rank is not None]
    launchers = sorted({e.node for e in found if e.rank is None})
    who = [protocol.rank_list(ranks)] if ranks else []
    if launchers:
        who.append(f"the launcher{'s' if len(launchers) > 1 else ''} on {', '.join(launchers)}")
    first = _quote(found[0].finding.line)[:120]
    return [f"... then {' and '.join(who)}: consequences, folded (the first: {first})"]


# What of the batch shell's stderr is evidence: Slurm's words of the end, and clustertrain's.
_SLURM_SAID = re.compile(
    SLURM_END.pattern + "|" + OOM_KILL.pattern + r"|^srun: error: |^clustertrain: "
)
# The line that decided a kind that no rank decided, by what it says.
_DECISIVE = {
    Kind.TIME_LIMIT: re.compile(r"DUE TO TIME LIMIT"),
    Kind.PREEMPTED: re.compile(r"DUE TO PREEMPTION"),
    Kind.NODE_LOST: re.compile(r"Node failure on|DUE TO NODE FAILURE"),
    Kind.CANCELLED: re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED(?: AT \S+)? \*\*\*"),
    Kind.HOST_OOM: OOM_KILL,
}


def _decisive(kind: Kind, records: Records, end: End | None) -> str:
    pattern = _DECISIVE.get(kind)
    said = [line for line in records.batch if pattern and pattern.search(line)]
    if said:
        return said[-1].strip()
    if end is not None:
        return end.finding.line.strip()
    return {Kind.HANG: records.hang, Kind.SETUP: records.setup}.get(kind) or ""


# What to do, by kind (and a few variants of one); the headlines are built below.
_HINTS = {
    Kind.CUDA_OOM: "a smaller batch per GPU, mixed precision, activation checkpointing or FSDP; "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in env where much memory is reserved "
    "but unallocated",
    Kind.HOST_OOM: "ask for more host memory (mem, mem_per_gpu), or hold less at once: fewer "
    "data loader workers, a smaller prefetch, a memory-mapped dataset",
    Kind.DIED_AT_EXIT: "nothing to redo: the crash came after training, in the native teardown "
    "(threads of the process group still running at exit); end the script with "
    "clustertrain.runtime.finish(), which exits without it",
    "timed out": "a rank did not reach the collective: stuck, far slower, or on another code "
    "path (a collective under `if rank == 0`); with hang_timeout_s below the collective "
    "timeout, clustertrain's watchdog takes every rank's stack",
    Kind.COLLECTIVE: "a fault in the network or a GPU between the ranks: NCCL_DEBUG=INFO in env "
    "says which; check the interface (socket_ifname) and the node's links, and exclude the "
    "node if it repeats",
    "in use": "another process or job on that node holds the port; clustertrain derives the "
    "port from the job id, so a new submission gets another",
    Kind.RENDEZVOUS: "a node did not join: its launcher never started (see its log, and sinfo "
    "-N) or cannot reach the head node (firewall, interface: socket_ifname); rdzv_timeout_s "
    "bounds the wait",
    "the job's": "the script or module is not where the nodes look: check script or module in "
    "the job file, and that the code is on a filesystem every node sees",
    Kind.NOT_IMPORTABLE: "install it in the job's environment on every node (its venv, "
    "container image, or a setup line that loads it)",
    Kind.MISSING_DATA: "put the data where every node reads it (a shared filesystem) or fix its "
    "path; a prepare step in the job file fetches it before the job is queued",
    Kind.DISK_FULL: "free space where the job writes (its run folder, checkpoints, /tmp: df -h "
    "on the node says which is full), or write checkpoints to a larger filesystem",
    Kind.TIME_LIMIT: "raise time in the job file, or let it resume: a script that checkpoints "
    "on runtime.StopRequest (Slurm's warning, signal_lead_s ahead) is requeued",
    Kind.PREEMPTED: "resubmit, or let it resume by itself: a script that checkpoints on "
    "runtime.StopRequest is requeued (max_requeues); or use a partition or QOS without "
    "preemption",
    Kind.NODE_LOST: "nothing in the job failed: resubmit; spare_nodes lets a job go on without "
    "a lost node, and `clustertrain nodes` keeps it out of your next submissions",
    Kind.CANCELLED: "nothing failed: the job was cancelled (scancel, clustertrain cancel, or "
    "Slurm's administrators); submit it again to rerun",
    Kind.HANG: "every rank's stack is in the run folder (logs/attempt-K/heartbeats*/"
    "rank-N.stack): the ranks that wait where the others do not are the suspects",
    Kind.SETUP: "fix that line in the job file's setup or node_setup (or your site's "
    "sites.yaml); try it by hand on a compute node (srun --pty bash)",
    Kind.NO_RESTART: f"the job's own code ended it with exit {protocol.NO_RESTART_EXIT}, which "
    "says restarting cannot help (a bad configuration, missing data): fix what it says, then "
    "submit again",
    Kind.RESTART_STORM: "each restart resumed from that checkpoint and failed again before the "
    "next one, so another would too: fix the fault the ranks report, or resume from an older "
    "checkpoint if that one is bad (storm_restarts: 0 leaves the restarts to max_restarts)",
    "absent": "the absent ranks' own lines say why they never came (a crash or a wait before "
    "init_process_group); their node's log too; rdzv_timeout_s bounds the wait",
}


@dataclass(frozen=True)
class _Case:
    """What a headline is built from: the records, the deciding writer's ``end`` (where a
    writer decided), every writer's (``found``) and a ``node`` that Slurm named."""

    records: Records
    end: End | None
    found: Sequence[End]
    node: str | None

    @property
    def it(self) -> End:
        assert self.end is not None, "a rank's kind is built from its end"
        return self.end


def _exception(c: _Case) -> tuple[str, str]:
    f, line = c.it.finding, _quote(c.it.finding.line)
    own = line.startswith("error:")
    head = f"{c.it.who()} failed: {line}" if own else f"{c.it.who()} raised {line}{_at(f.where)}"
    fix = f"the error is in the job's code at {f.where}; " if f.where else ""
    return head, f"{fix}{_logs(c.records, c.it)} shows its traceback"


def _cuda_oom(c: _Case) -> str:
    f = c.it.finding
    detail = f": {f.detail}" if f.detail else ""
    at = f", at {f.where}" if f.where else ""
    return f"{c.it.who()} ran out of GPU memory (CUDA out of memory{detail}{at})"


def _host_oom(c: _Case) -> str:
    records, kept = c.records, c.records.accounting
    why = ["Slurm: OUT_OF_MEMORY"] if records.state == "OUT_OF_MEMORY" else []
    steps = [s for s in (kept.steps if kept else ()) if s.state == "OUT_OF_MEMORY"]
    why += [f"step {s.step} OUT_OF_MEMORY" for s in steps if not why][:1]
    kills = [m[0] for line in records.batch if (m := OOM_KILLS.search(line))]
    srun = [line for line in records.batch if OOM_KILL.search(line)]
    why += kills[-1:] or [f"srun: {_quote(line.rpartition(': ')[2])}" for line in srun[-1:]]
    rss = max((s.max_rss_kb for s in steps if s.max_rss_kb), default=None)
    why += [f"MaxRSS {rss / (1 << 20):.1f} GiB"] if rss else []
    who = c.end.who() if c.end else f"a process on {c.node}" if c.node else "a process"
    return f"{who} was killed by the out-of-memory killer: host memory ran out ({'; '.join(why)})"


def _signal(c: _Case) -> tuple[str, str]:
    f = c.it.finding
    number = f.signal or 0
    what, hint = SIGNALS.get(number, ("a signal", f"ended by {signal_name(number)}"))
    detail = f": {_quote(f.detail)}" if f.detail else ""
    exit_ = " at exit" if f.at_exit else ""
    head = f"{c.it.who()} was killed by {signal_name(number)} (signal {number}, {what}){exit_}"
    if number == signals.SIGABRT:
        head = f"{c.it.who()} aborted{exit_} (SIGABRT, signal 6)"
    return head + detail + _at(f.where), hint


def _died_at_exit(c: _Case) -> str:
    f, end = c.it.finding, c.it
    verb = "aborted" if f.signal in (None, signals.SIGABRT) else "crashed"
    said = _quote(f.detail) if f.detail else SIGNALS.get(f.signal or 0, ("a signal", ""))[0]
    who = f"rank {end.rank}" if end.rank is not None else end.who()
    metric = f"; final {c.records.last_metric}" if c.records.last_metric else ""
    return (
        f"finished, then {who} {verb} at exit ({signal_name(f.signal or 6)}: {said}); all ranks "
        f"completed training{metric}; results are intact ({who} on {end.node})"
    )


def _collective(c: _Case) -> tuple[str, str]:
    f, who = c.it.finding, c.it.who()
    if f.weight == TIMED_OUT:
        timed = [e.rank for e in c.found if e.finding.weight == TIMED_OUT and e.rank is not None]
        tails = {t.rank for t in c.records.tails if t.rank is not None}
        quiet = sorted((set(range(c.records.world_size)) or tails) - set(timed))
        others = f" ({protocol.rank_list(timed)} timed out)" if len(timed) > 1 else ""
        suspects = f"; {protocol.rank_list(quiet)} did not: the suspects" if quiet and timed else ""
        return f"a collective timed out on {who}: {f.detail}{others}{suspects}", _HINTS["timed out"]
    if f.weight < TIMED_OUT:
        what = "NCCL error" if "nccl" in f.line.lower() else "error in a collective"
        return f"{what} on {who}: {_quote(f.detail)}", _HINTS[Kind.COLLECTIVE]
    hint = (
        f"a peer died without a word (killed, or its node lost): {_logs(c.records, None)} and "
        "the nodes' state (sinfo -N) may say which"
    )
    return f"{who} lost a peer ({_quote(f.line)}); no rank said why", hint


def _rendezvous(c: _Case) -> tuple[str, str]:
    line = c.it.finding.line
    if "EADDRINUSE" in line or "ddress already in use" in line:
        head = f"the rendezvous could not start on {c.it.node}: its port is already in use"
        return f"{head} (EADDRINUSE)", _HINTS["in use"]
    waiting = [e for e in c.found if e.finding.kind is Kind.RENDEZVOUS]
    said = [m for e in waiting if (m := protocol.ABSENT_RANKS.search(e.finding.line))]
    if said:  # clustertrain.env's own words: the ranks that came name those that did not
        ranks = [e.rank for e in waiting if e.rank is not None]
        nodes = ", ".join(sorted({e.node for e in waiting}))
        gave_up = protocol.rank_list(ranks) if ranks else nodes
        head = f"the rendezvous never formed: {said[0][1]} ({said[0][2]}) never joined"
        return f"{head}; {gave_up} gave up waiting", _HINTS["absent"]
    waited = sorted({e.node for e in waiting})
    silent = [node for node in c.records.nodes if node not in waited]
    absent = f"; no word from {', '.join(silent)}" if silent else ""
    head = f"the rendezvous never formed: {', '.join(waited)} gave up waiting ({_quote(line)})"
    return head + absent, _HINTS[Kind.RENDEZVOUS]


def _not_importable(c: _Case) -> tuple[str, str]:
    f = c.it.finding
    if f.detail.startswith("the job's"):
        return f"{c.it.who()} could not start {_quote(f.detail)}", _HINTS["the job's"]
    return f"{c.it.who()} could not import: {_quote(f.detail)}{_at(f.where)}", _HINTS[
        Kind.NOT_IMPORTABLE
    ]


def _missing_data(c: _Case) -> str:
    f = c.it.finding
    return f"{c.it.who()} did not find its data: {_quote(f.line)}{_at(f.where)}"


def _disk_full(c: _Case) -> str:
    f = c.it.finding
    at = f", at {f.where}" if f.where else ""
    return f"{c.it.who()} could not write: no space left on device ({_quote(f.line)}{at})"


def _time_limit(c: _Case) -> str:
    records, kept = c.records, c.records.accounting
    took = records.elapsed or (duration(kept.elapsed_s) if kept and kept.elapsed_s else "")
    metric = f"; last {records.last_metric}" if records.last_metric else ""
    said = "Slurm: TIMEOUT" if records.state == "TIMEOUT" else "Slurm ended it DUE TO TIME LIMIT"
    return f"reached its time limit{f' after {took}' if took else ''} ({said}){metric}"


def _preempted(c: _Case) -> str:
    again = f" (after {c.records.requeues} requeue(s))" if c.records.requeues else ""
    return f"preempted: Slurm gave its nodes to a higher-priority job{again}"


def _node_lost(c: _Case) -> str:
    lost = list(c.records.lost_nodes)
    them = "them" if len(lost) > 1 else "it"
    ended = " and ended the job (NODE_FAIL)" if c.records.state == "NODE_FAIL" else ""
    return f"{', '.join(lost) or 'a node'} lost: Slurm declared {them} down{ended}"


def _cancelled(c: _Case) -> str:
    if c.records.source == LOCAL:  # no scheduler: `clustertrain cancel`, or an interrupt
        return "cancelled (clustertrain cancel, or an interrupt of the run)"
    when = [m[4] for line in c.records.batch if (m := SLURM_END.search(line)) and m[4]]
    by = f" by {c.records.cancelled_by}" if c.records.cancelled_by else ""
    unknown = "" if by else " (by whom: Slurm's accounting says, where it keeps one)"
    return f"cancelled{by}{f' at {when[-1]}' if when else ''}{unknown}"


def _unknown(c: _Case) -> tuple[str, str]:
    records = c.records
    code = f", exit code {records.exit_code}" if records.exit_code else ""
    known = [f"Slurm says {records.state}{code}"]
    known += [_quote(records.reason)] if records.reason else []
    for said in records.exits[:2]:
        own = [t for t in records.tails if (t.node, t.rank) == (said.node, said.rank)]
        last = f" (its last line: {_quote(own[0].lines[-1])})" if own and own[0].lines else ""
        known.append(f"rank {said.rank} on {said.node} exited with code {said.exit_code}{last}")
    known += [] if records.exits else ["no rank left an error in the run folder"]
    known += [f"its supervisor ended with status {records.ended}"] if records.ended else []
    hint = (
        f"{_logs(records, None)} shows every rank's errors; "
        f"`clustertrain logs {records.job_id} --raw` everything"
    )
    return "cause unknown: " + "; ".join(known), hint


def _no_restart(c: _Case) -> str:
    rank, node = c.records.no_restart or (None, c.node)
    own = f": {_quote(c.end.finding.line)}" if c.end is not None else ""
    return f"rank {rank} on {node} asked not to be restarted (exit {protocol.NO_RESTART_EXIT}){own}"


def _restart_storm(c: _Case) -> str:
    restarts, at = c.records.storm or (0, "")
    last = f"; the last: {c.it.who()}: {_quote(c.it.finding.line)}" if c.end is not None else ""
    past = f"{at} (the last checkpoint)" if at else "the last checkpoint"
    plural = "s" * (restarts != 1)
    return (
        f"restart storm: {restarts} restart{plural} never got past {past}; stopped restarting{last}"
    )


_BUILDERS: dict[Kind, Callable[[_Case], str | tuple[str, str]]] = {
    Kind.EXCEPTION: _exception,
    Kind.CUDA_OOM: _cuda_oom,
    Kind.HOST_OOM: _host_oom,
    Kind.SIGNAL: _signal,
    Kind.DIED_AT_EXIT: _died_at_exit,
    Kind.COLLECTIVE: _collective,
    Kind.RENDEZVOUS: _rendezvous,
    Kind.NOT_IMPORTABLE: _not_importable,
    Kind.MISSING_DATA: _missing_data,
    Kind.DISK_FULL: _disk_full,
    Kind.TIME_LIMIT: _time_limit,
    Kind.PREEMPTED: _preempted,
    Kind.NODE_LOST: _node_lost,
    Kind.CANCELLED: _cancelled,
    Kind.HANG: lambda c: c.records.hang or "hang",
    Kind.SETUP: lambda c: f"{c.records.setup}, before any rank started",
    Kind.UNKNOWN: _unknown,
    Kind.NO_RESTART: _no_restart,
    Kind.RESTART_STORM: _restart_storm,
}


def build(
    kind: Kind,
    records: Records,
    end: End | None = None,
    found: Sequence[End] = (),
    node: str | None = None,
) -> Cause:
    """The cause of ``kind``: its headline and hint, from ``records``, the deciding writer's
    ``end`` (where a writer decided), every writer's (``found``) and a ``node`` Slurm named."""
    said = _BUILDERS[kind](_Case(records, end, found, node))
    headline, hint = said if isinstance(said, tuple) else (said, _HINTS[kind])
    lost = records.lost_nodes[0] if kind is Kind.NODE_LOST and records.lost_nodes else None
    return Cause(
        kind=kind,
        headline=headline,
        hint=hint,
        ranks=(end.rank,) if end is not None and end.rank is not None else (),
        node=node or lost or (end.node if end is not None else None),
        decisive=_decisive(kind, records, end),
        evidence=evidence(records, end, found),
    )

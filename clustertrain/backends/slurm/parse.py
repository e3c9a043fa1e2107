"""What Slurm's commands print, read: pure functions from their output to clustertrain's types
(scontrol's job records, sacct's rows and a job's accounting, sinfo's partitions and nodes).
The calls are beside, in ``commands.py``; a test feeds these recorded output.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from clustertrain.jobstate import (
    SACCT,
    TERMINAL_STATES,
    Accounting,
    Allocation,
    Holding,
    JobState,
    StepUsage,
)
from clustertrain.protocol import NODE_NAME
from clustertrain.spec.fields import time_seconds

from .cluster_info import Node, Partition, gpu_count

_KEY_VALUE = re.compile(r"(\w+)=(\S*)")


def parse_scontrol_job(job_id: str, text: str) -> JobState:
    """Parse ``scontrol show job --oneliner``: one record (``Key=Value`` words), or for a job
    array one per task (pending tasks share one, ``ArrayTaskId=2-5%2``)."""
    records = [dict(_KEY_VALUE.findall(line)) for line in text.splitlines() if line.strip()]
    if "_" not in job_id and records and "ArrayTaskId" in records[0]:
        return _array_state(job_id, records)
    fields = dict(_KEY_VALUE.findall(text))
    restarts = fields.get("Restarts", "0")
    return JobState(
        job_id=job_id,
        state=fields.get("JobState", "UNKNOWN"),
        nodes=fields.get("NodeList", "") if fields.get("NodeList") != "(null)" else "",
        elapsed=fields.get("RunTime", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        exit_code=fields.get("ExitCode", ""),
        reason=fields.get("Reason", "") if fields.get("Reason") != "None" else "",
    )


def node_list(text: str) -> str | None:
    """The NodeList of ``scontrol show job --oneliner``, or None where it holds none."""
    found = dict(_KEY_VALUE.findall(text)).get("NodeList", "")
    return found if found not in ("", "(null)") else None


def parse_holding(job_id: str, text: str, hostnames: str = "") -> Holding:
    """A job's allocation from ``scontrol show job --oneliner`` and ``scontrol show hostnames``
    of its NodeList; a name that is not a plain node name is left out (it could never be one:
    it would reach srun's --nodelist)."""
    fields = dict(_KEY_VALUE.findall(text))
    uid = re.fullmatch(r"[^()]*\((\d+)\)", fields.get("UserId", ""))
    nodes = tuple(name for name in hostnames.split() if NODE_NAME.fullmatch(name))
    return Holding(
        job_id=job_id,
        state=fields.get("JobState", "UNKNOWN"),
        uid=int(uid[1]) if uid else None,
        nodes=nodes,
        workdir=fields.get("WorkDir", ""),
    )


def _array_state(job_id: str, records: list[dict[str, str]]) -> JobState:
    """The array as one state: running while any task runs, pending while any waits, else
    COMPLETED when every task did, else the first other end."""
    tasks: dict[int, str] = {}
    for fields in records:
        for number in _task_numbers(fields.get("ArrayTaskId", "")):
            tasks[number] = fields.get("JobState", "UNKNOWN")
    states = list(tasks.values())
    ended = [s for s in states if s in TERMINAL_STATES]
    if len(ended) < len(states):
        state = "PENDING" if all(s == "PENDING" for s in states) else "RUNNING"
    else:
        state = next((s for s in states if s != "COMPLETED"), "COMPLETED")
    return JobState(job_id=job_id, state=state, tasks=tuple(sorted(tasks.items())))


def _task_numbers(text: str) -> list[int]:
    """``3``, ``2-5``, ``1,4-6%2`` (the throttle after %) as task numbers."""
    numbers: list[int] = []
    for part in text.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            numbers.extend(range(int(low), int(high or low) + 1))
    return numbers


def parse_sacct(job_id: str, text: str) -> JobState:
    """Parse ``sacct -P`` lines (JobID|State|NodeList|Elapsed[|ExitCode]); the last one wins.

    sacct writes "CANCELLED by 0": the state is the first word.
    """
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    rows = [row for row in rows if row[0] == job_id] or rows
    row = rows[-1] + [""] * 5
    return JobState(
        job_id=job_id,
        state=row[1].split(" ")[0] or "UNKNOWN",
        nodes=row[2],
        elapsed=row[3],
        exit_code=row[4],
        source=SACCT,
    )


# What Slurm's commands say when its controller cannot be asked at all: no configuration (the
# client's "configless" fetch failed), no controller listening, no name for it, no answer in
# time. Not a word about any job.
_NO_CONFIGURATION = re.compile(
    r"_establish_config_source: failed to fetch config|Could not establish a configuration source"
)
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused"
    r"|resolve_ctls_from_dns_srv|Zero Bytes were transmitted or received|"
    + _NO_CONFIGURATION.pattern
)


def unreachable(text: str) -> bool:
    """Whether a Slurm command's stderr says that the controller cannot be asked."""
    return _UNREACHABLE.search(text) is not None


def lacks_configuration(text: str) -> bool:
    """Whether Slurm's words say it found no configuration: no ``SLURM_CONF``, no
    /etc/slurm/slurm.conf and no controller to fetch one from."""
    return _NO_CONFIGURATION.search(text) is not None


def parse_partitions(text: str) -> tuple[Partition, ...]:
    """Parse ``scontrol show partition --oneliner``: one ``Key=Value`` line per partition."""
    parts = []
    for line in text.splitlines():
        fields = dict(_KEY_VALUE.findall(line))
        if "PartitionName" not in fields:
            continue
        max_nodes = fields.get("MaxNodes", "UNLIMITED")
        max_time = fields.get("MaxTime", "UNLIMITED")
        parts.append(
            Partition(
                name=fields["PartitionName"],
                default=fields.get("Default") == "YES",
                max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
                max_time_s=time_seconds(max_time)
                if max_time not in ("UNLIMITED", "INFINITE")
                else None,
                state=fields.get("State", "UNKNOWN"),
            )
        )
    return tuple(parts)


def parse_nodes(text: str) -> tuple[Node, ...]:
    """Parse ``sinfo --Node --format %N|%P|%c|%m|%G|%t``, one line per node and partition.

    A node in several partitions appears once per partition; sinfo marks the default one '*'.
    """
    merged: dict[str, Node] = {}
    for line in text.splitlines():
        cols = line.strip().split("|")
        if len(cols) != 6 or not cols[2].isdigit():
            continue
        name, part, cpus, memory, gres, state = cols
        prior = merged.get(name)
        merged[name] = Node(
            name=name,
            partitions=(prior.partitions if prior else ()) + (part.rstrip("*"),),
            cpus=int(cpus),
            memory_mb=int(memory.rstrip("+")) if memory.rstrip("+").isdigit() else 0,
            gpus=gpu_count(gres),
            state=state,
        )
    return tuple(merged.values())


# sacct's fields for a job's accounting, in this order (``sacct -P -n -o ...``).
ACCOUNTING_FIELDS = "JobID,State,ExitCode,ElapsedRaw,MaxRSS,TotalCPU"
_RSS_UNITS = {"K": 1, "M": 1 << 10, "G": 1 << 20, "T": 1 << 30}
# TotalCPU: [DD-][HH:]MM:SS[.mmm]
_CPU_TIME = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.(\d+))?")


def parse_accounting(job_id: str, text: str) -> Accounting | None:
    """Parse ``sacct -P -n -o JobID,State,ExitCode,ElapsedRaw,MaxRSS,TotalCPU`` for
    ``job_id``: the job's own row, then each of its steps' (``N.batch``, ``N.0``...). None when
    sacct has no row of the job itself."""
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    rows = [row + [""] * (6 - len(row)) for row in rows if len(row) <= 6]
    own = next((row for row in rows if row[0] == job_id), None)
    if own is None:
        return None
    steps = tuple(
        StepUsage(
            step=row[0].removeprefix(f"{job_id}."),
            state=row[1].split(" ")[0] or "UNKNOWN",
            exit_code=row[2],
            elapsed_s=int(row[3]) if row[3].isdigit() else 0,
            max_rss_kb=_rss_kb(row[4]),
            total_cpu_s=_cpu_seconds(row[5]),
        )
        for row in rows
        if row[0].startswith(f"{job_id}.")
    )
    by = own[1].partition(" by ")[2]
    return Accounting(
        job_id=job_id,
        state=own[1].split(" ")[0] or "UNKNOWN",
        exit_code=own[2],
        elapsed_s=int(own[3]) if own[3].isdigit() else 0,
        steps=steps,
        cancelled_by=by if by.isdigit() and len(by) <= 10 else "",
    )


# sacct's times as it prints Start and End (no zone: the cluster's), and a job's NodeList.
_SLURM_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_HOSTLIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,\[\]-]{0,1023}")
# How long after a job's recorded end its lost node's event may begin (Slurm ends the job and
# records the node DOWN in the same pass; the slack covers the accounting's seconds).
EVENT_SLACK_S = 60
# A node state that is down, with its flags ("DOWN*": not responding; "DOWN+DRAIN").
_DOWN = re.compile(r"DOWN(?![A-Z_])")


def parse_spans(text: str) -> list[tuple[str, str, str]]:
    """Each allocation that ended NODE_FAIL (a requeued job has one per attempt): its NodeList,
    its Start, and its End plus :data:`EVENT_SLACK_S`, from ``sacct -X --duplicates -n -P -o
    State,NodeList,Start,End``. A row that is not what sacct prints is left out: each value goes
    back to sacctmgr."""
    spans = []
    for line in text.splitlines():
        row = line.split("|")
        if len(row) != 4 or row[0] != "NODE_FAIL" or not _HOSTLIST.fullmatch(row[1]):
            continue
        if not (_SLURM_TIME.fullmatch(row[2]) and _SLURM_TIME.fullmatch(row[3])):
            continue
        try:
            datetime.fromisoformat(row[2])
            later = datetime.fromisoformat(row[3]) + timedelta(seconds=EVENT_SLACK_S)
        except ValueError:  # the shape of a time, not one (month 13)
            continue
        spans.append((row[1], row[2], later.strftime("%Y-%m-%dT%H:%M:%S")))
    return spans


def parse_down_events(text: str, start: str) -> tuple[str, ...]:
    """The nodes that ``sacctmgr -n -P show event format=NodeName,TimeStart,State`` says went
    DOWN at or after ``start`` (an event still open when the job began is no loss of its), in
    the order they went; a name that is not a plain node name is left out."""
    lost: dict[str, None] = {}
    for line in text.splitlines():
        row = line.split("|")
        if len(row) != 3 or not NODE_NAME.fullmatch(row[0]) or not _SLURM_TIME.fullmatch(row[1]):
            continue
        if row[1] >= start and any(_DOWN.match(word) for word in row[2].upper().split("+")):
            lost.setdefault(row[0])
    return tuple(lost)


def _rss_kb(text: str) -> int | None:
    """sacct's MaxRSS (``1234K``, ``12.5M``, a bare number of bytes); None where unmeasured."""
    if not text:
        return None
    unit = _RSS_UNITS.get(text[-1].upper())
    number = text[:-1] if unit else text
    try:
        value = float(number)
    except ValueError:
        return None
    return int(value * unit) if unit else int(value) // 1024


def _cpu_seconds(text: str) -> float | None:
    found = _CPU_TIME.fullmatch(text)
    if not found:
        return None
    days, hours, minutes, seconds, fraction = found.groups()
    whole = int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)
    return whole + (float(f"0.{fraction}") if fraction else 0.0)


# sacct's fields for a job's allocations, in this order (``sacct -X -D -P -n -o ...``): one row
# per allocation, every attempt of a requeued job (--duplicates) and every task of an array.
ALLOCATION_FIELDS = "JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES"
# What sacct prints for a time it does not have (not started, still running).
_NO_TIME = ("Unknown", "None", "")
_COUNT = re.compile(r"[0-9]{1,9}")


def parse_allocations(job_id: str, text: str) -> tuple[Allocation, ...]:
    """Parse ``sacct -X -D -n -P -o JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES`` for
    ``job_id``: its allocations in order of their start (an array's: each task's, ``N_M``). A
    value that is not what sacct writes is None, and named in ``unreadable``."""
    found = []
    for line in text.splitlines():
        row = line.split("|")
        if len(row) != 7 or not (row[0] == job_id or _task_of(row[0], job_id)):
            continue
        unreadable: list[str] = []
        times = zip(row[2:5], ("Submit", "Start", "End"), strict=True)
        submit, start, end = (_when(value, name, unreadable) for value, name in times)
        elapsed = int(row[5]) if _COUNT.fullmatch(row[5]) else None
        if elapsed is None and row[5] not in _NO_TIME:
            unreadable.append("ElapsedRaw")
        nodes, gpus = _tres(row[6], unreadable)
        state = row[1].split(" ")[0]
        state = state if re.fullmatch(r"[A-Z_]{1,32}\+?", state) else "UNKNOWN"
        found.append(
            Allocation(row[0], state, submit, start, end, elapsed, nodes, gpus, tuple(unreadable))
        )
    return tuple(sorted(found, key=lambda a: a.start or a.submit or 0.0))


def _task_of(text: str, job_id: str) -> bool:
    """Whether sacct's ``text`` is a task of the array ``job_id`` (``42_3``; a pending
    ``42_[4-7]`` is not yet an allocation)."""
    array, sep, number = text.partition("_")
    return bool(sep) and array == job_id and _COUNT.fullmatch(number) is not None


def _when(text: str, name: str, unreadable: list[str]) -> float | None:
    """sacct's time (``2026-12-07T21:06:19``, this host's local time) as seconds since the
    epoch; None for none yet, or for what is no time (then ``name`` is unreadable)."""
    if text in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        unreadable.append(name)
        return None


def _tres(text: str, unreadable: list[str]) -> tuple[int | None, int | None]:
    """AllocTRES (``billing=2,cpu=2,gres/gpu=2,mem=4G,node=2``): its nodes and GPUs. GPUs are
    None where it names none (the cluster's AccountingStorageTRES lacks gres/gpu, or none were
    allocated); typed ones (``gres/gpu:a100=2``) count where the plain total is missing."""
    if not text:
        return None, None
    pairs = [part.partition("=") for part in text.split(",")]
    if not all(sep and key for key, sep, _ in pairs):
        unreadable.append("AllocTRES")
        return None, None
    found = {key: value for key, _, value in pairs}
    counts = {key: int(v) for key, v in found.items() if _COUNT.fullmatch(v)}
    if any(k in ("node", "gres/gpu") and k not in counts for k in found):
        unreadable.append("AllocTRES")
    typed = [v for k, v in counts.items() if k.startswith("gres/gpu:")]
    gpus = counts.get("gres/gpu", sum(typed) if typed else None)
    return counts.get("node"), gpus

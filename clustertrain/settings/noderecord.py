"""Your record of bad nodes, per cluster: the nodes qualification flagged and the nodes your
jobs lost, each with why, the job and until when.

It lives beside your hosts file, ``~/.config/clustertrain/nodes/<cluster>.json``
(``$XDG_CONFIG_HOME`` moves it; ``<cluster>`` is slurm.conf's ``ClusterName``). A submission
reads what your recent run folders say (:func:`harvest`: ``flagged``, ``node_lost`` and
``straggler`` events of folders you own, in the runs root) into it, and excludes every node
whose entry has not expired (``--exclude``; the dry run shows it and why), unless the job says
``avoid_bad_nodes: false``. ``clustertrain nodes`` lists it and clears entries.

Every value is input, the record's and the run folders' alike: a node name is one Slurm node
name (:data:`clustertrain.protocol.NODE_NAME`) or the record is refused in one line; it never
reaches sbatch as anything but one name of ``--exclude``. A submission ignores a record that is
not one, or not yours alone, with one warning (:func:`load_or_ignore`): never obeyed. The
writer (:func:`save`) keeps within what the reader takes: the entries that last longest, the
newest clears, none older than the expiry.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, printable, read_regular, write_private
from clustertrain.rank import events

from . import ENV_CONFIG_DIR, config_dir, read_setting
from . import cluster_name as settings_cluster_name

EXPIRY_S = 7 * 24 * 3600
# How many of the newest run folders a submission reads, and how much of each events file.
RECENT_RUNS, EVENTS_BYTES, MAX_ENTRIES = 50, 1 << 20, 1000
_DURATION = re.compile(r"([0-9]{1,5})([mhd])")
_SECONDS = {"m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Entry:
    node: str
    why: str
    job: str
    until: float

    def line(self) -> str:
        when = datetime.fromtimestamp(self.until, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f"{self.node}: {printable(self.why)} (job {printable(self.job)}; until {when})"


def duration(text: str) -> float:
    """``30m``, ``12h``, ``7d`` as seconds (1 minute to 366 days)."""
    match = _DURATION.fullmatch(text)
    seconds = int(match[1]) * _SECONDS[match[2]] if match else 0
    if not 60 <= seconds <= 366 * 86400:
        raise UserError(f"expire: {text!r} is not a duration like 30m, 12h or 7d (at most 366d)")
    return float(seconds)


def node_name(text: str, what: str = "NODE") -> str:
    if not protocol.NODE_NAME.fullmatch(text):
        raise UserError(
            f"{what}: {printable(repr(text))[:80]} is not a Slurm node name; give one name like "
            "node3 (no range, no option)"
        )
    return text


def cluster_name(environ: dict[str, str] | None = None) -> str:
    """slurm.conf's ``ClusterName`` (:func:`clustertrain.settings.cluster_name`), else
    ``default``: which record a submission reads."""
    return settings_cluster_name(environ) or "default"


def path_for(cluster: str) -> Path:
    return config_dir() / "nodes" / f"{cluster}.json"


@dataclass
class Record:
    """The entries, and when you cleared each node (an event before that is not taken again)."""

    entries: list[Entry]
    cleared: dict[str, float]


def load_or_ignore(path: Path, warn: Callable[[str], None] | None = None) -> Record:
    """The record, or, where it is not one or not yours alone, an empty one and one line to
    ``warn`` (standard error unless said): a record a teammate could have written is never
    obeyed, and a broken one stops no submission."""
    try:
        return load(path)
    except UserError as error:
        line = f"ignoring your node record: {error}"
        if warn is None:
            print(f"clustertrain: warning: {line}", file=sys.stderr)
        else:
            warn(line)
        return Record([], {})


def load(path: Path) -> Record:
    """The record; an empty one without a file. One that is not a record is refused."""
    if not path.exists():
        return Record([], {})
    data = read_setting(path, 4 << 20, "node record")
    try:
        raw = parse_json(data, str(path))
        if not isinstance(raw, dict) or set(raw) != {"entries", "cleared"}:
            raise ValueError("not a record of entries and clears")
        entries, cleared = raw["entries"], raw["cleared"]
        if not isinstance(entries, list) or not isinstance(cleared, dict):
            raise ValueError("entries is a list, cleared a mapping")
        if len(entries) > MAX_ENTRIES or len(cleared) > MAX_ENTRIES:
            raise ValueError(f"more than {MAX_ENTRIES} entries")
        return Record([_entry(item) for item in entries], {
            _name(node): _time(when) for node, when in cleared.items()
        })  # fmt: skip
    except (RunFolderError, ValueError, TypeError, KeyError) as exc:
        raise UserError(
            f"node record: {path} is not one ({printable(str(exc))[:120]}); fix it, or remove it "
            "with `clustertrain nodes clear --all`"
        ) from None


def _name(node: Any) -> str:
    if not isinstance(node, str) or not protocol.NODE_NAME.fullmatch(node):
        raise ValueError(f"not a node name: {printable(repr(node))[:40]}")
    return node


def _time(when: Any) -> float:
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 < when < 1e11:
        raise ValueError("a time is a number of seconds")
    return float(when)


def _entry(item: Any) -> Entry:
    if not isinstance(item, dict) or set(item) != {"node", "why", "job", "until"}:
        raise ValueError("an entry has node, why, job and until")
    why, job = item["why"], item["job"]
    if not (isinstance(why, str) and isinstance(job, str) and len(why) <= 300 and len(job) <= 64):
        raise ValueError("why and job are short texts")
    return Entry(_name(item["node"]), why, job, _time(item["until"]))


def save(path: Path, record: Record, now: float | None = None) -> None:
    """Write the record whole (a temporary file renamed over it), readable by you only, as
    :func:`load` reads it back: at most :data:`MAX_ENTRIES` entries (the ones that last
    longest) and clears (the newest; one older than :data:`EXPIRY_S` holds back no event that
    has not expired), in a folder of yours alone. Anything else is one line."""
    kept = trimmed(record, now)
    text = json.dumps({"entries": [asdict(e) for e in kept.entries], "cleared": kept.cleared},
                      indent=1, ensure_ascii=False) + "\n"  # fmt: skip
    try:
        _own_folder(path.parent)
        write_private(path, text.encode("utf-8"))
    except OSError as error:
        raise UserError(
            f"node record: cannot write {path} ({error.strerror}); check ${ENV_CONFIG_DIR} "
            "and $XDG_CONFIG_HOME"
        ) from None


def trimmed(record: Record, now: float | None = None) -> Record:
    """``record`` as the reader takes it: entries and clears within :data:`MAX_ENTRIES`."""
    now = time.time() if now is None else now
    entries = sorted(current(record.entries, now), key=lambda e: e.until, reverse=True)
    entries = [dataclasses.replace(e, why=e.why[:300], job=e.job[:64]) for e in entries]
    cleared = sorted(
        ((when, node) for node, when in record.cleared.items() if now - when < EXPIRY_S),
        reverse=True,
    )[:MAX_ENTRIES]
    return Record(
        sorted(entries[:MAX_ENTRIES], key=lambda e: e.node),
        {node: when for when, node in sorted(cleared, key=lambda c: c[1])},
    )


def _own_folder(folder: Path) -> None:
    """``folder`` made (0700) where missing; one that is not yours alone is refused, as the
    reader would refuse the record in it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise OSError(errno.EPERM, "not a folder of yours")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        folder.chmod(0o700)


def current(entries: list[Entry], now: float | None = None) -> list[Entry]:
    """The entries not expired, the latest for each node."""
    now = time.time() if now is None else now
    latest: dict[str, Entry] = {}
    for entry in entries:
        if entry.until > now and (
            entry.node not in latest or entry.until > latest[entry.node].until
        ):
            latest[entry.node] = entry
    return sorted(latest.values(), key=lambda e: e.node)


def harvest(runs_root: Path, now: float | None = None) -> list[Entry]:
    """What your newest run folders under ``runs_root`` say of bad nodes: each flagged node
    (with its figure) and each lost one, valid for :data:`EXPIRY_S` from the event. Only
    folders and events files you own are read; a value that is not a node name is left out."""
    now = time.time() if now is None else now
    found: list[Entry] = []
    for folder in _recent(runs_root, now):
        path = folder / protocol.EVENTS_FILE
        try:
            if path.lstat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        job = _job_id(folder)
        for event in events.scan(path, max_bytes=EVENTS_BYTES)[0]:
            nodes = str(event.values.get("nodes", ""))
            if event.name == events.FLAGGED:
                why = "flagged: " + str(event.values.get("why", ""))
            elif event.name == events.NODE_LOST:
                why = "lost mid-job"
            elif event.name == events.STRAGGLER:
                why = "straggler: " + str(event.values.get("why", ""))
            else:
                continue
            for node in nodes.split(","):
                if protocol.NODE_NAME.fullmatch(node):
                    found.append(Entry(node, why[:300], job, event.time + EXPIRY_S))
    return current(found, now)


def _recent(root: Path, now: float) -> list[Path]:
    """Your run folders under ``root`` changed within :data:`EXPIRY_S`, newest first."""
    try:
        children = list(os.scandir(root))
    except OSError:
        return []
    mine = []
    for child in children:
        try:
            info = child.stat(follow_symlinks=False)
        except OSError:
            continue
        is_dir = child.is_dir(follow_symlinks=False)
        if is_dir and info.st_uid == os.getuid() and now - info.st_mtime < EXPIRY_S:
            mine.append((info.st_mtime, Path(child.path)))
    return [path for _, path in sorted(mine, reverse=True)[:RECENT_RUNS]]


def _job_id(folder: Path) -> str:
    try:
        raw = parse_json(read_regular(folder / protocol.RECORD_FILE, 64 << 10), "job.json")
    except RunFolderError:
        return "?"
    job = raw.get("job_id") if isinstance(raw, dict) else None
    return job if isinstance(job, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,32}", job) else "?"


def merged(record: Record, harvested: list[Entry]) -> Record:
    """The record with what was harvested added (per node, the entry that lasts longest), but
    for what happened before you cleared its node."""
    taken = [e for e in harvested if e.until - EXPIRY_S > record.cleared.get(e.node, 0.0)]
    return Record(current([*record.entries, *taken]), record.cleared)


def read(path: Path, runs_root: Path, warn: Callable[[str], None] | None = None) -> Record:
    """The record at ``path`` (:func:`load_or_ignore`) with what your run folders under
    ``runs_root`` say added."""
    return merged(load_or_ignore(path, warn), harvest(runs_root))


def clear(record: Record, nodes: list[str], now: float | None = None) -> Record:
    """The record without ``nodes``' entries; events before now no longer add them."""
    now = time.time() if now is None else now
    cleared = {**record.cleared, **dict.fromkeys(nodes, now)}
    return Record([e for e in record.entries if e.node not in nodes], cleared)


def mine() -> Path:
    """Your record for the cluster this environment's Slurm configuration names."""
    return path_for(cluster_name())

"""A process by PID and start time, read from /proc: so a reused PID is never mistaken."""

from __future__ import annotations

from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from the state on (the name may hold spaces and parentheses)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot, as /proc says it), or None if gone."""
    fields = proc_stat(pid)
    return fields[19] if fields else None

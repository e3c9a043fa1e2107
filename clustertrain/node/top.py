"""One node's figures for ``clustertrain top``, read from /proc (and nvidia-smi where it exists).

``python -m clustertrain.node.top HEARTBEAT_DIR`` runs on every node of the job (an overlapping
step) and prints one JSON line: the node's CPU use and memory, each GPU's use and memory, and
each of its ranks of the step (found as clustertrain.node.stacks finds them): CPU % of one core
and resident memory. CPU figures are the difference of two readings ``INTERVAL_S`` apart, as
top(1) does between refreshes. The parsers are pure functions of the files' text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clustertrain.node.stacks import ranks_here
from clustertrain.procs import proc_stat

INTERVAL_S = 0.5
NVIDIA_SMI_WAIT_S = 10.0
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
_GPU_QUERY = "index,utilization.gpu,memory.used,memory.total"


def cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs, from /proc/stat's ``cpu`` line; idle and iowait
    are not busy, and steal (time a hypervisor gave others) is neither."""
    for line in stat.splitlines():
        words = line.split()
        if words and words[0] == "cpu":
            ticks = [int(word) for word in words[1:9]]
            idle = ticks[3] + ticks[4]
            total = sum(ticks[:7])
            return total - idle, total
    raise ValueError("/proc/stat: no cpu line")


def memory_kb(meminfo: str) -> tuple[int, int]:
    """(used, total) kB from /proc/meminfo: used is what is not available (MemAvailable: the
    kernel's own estimate, page cache that can be dropped counts as free)."""
    values = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if rest.split():
            values[name] = int(rest.split()[0])
    total = values["MemTotal"]
    return total - values.get("MemAvailable", values.get("MemFree", 0)), total


def process_ticks(fields: list[str]) -> tuple[int, int]:
    """(utime + stime, resident kB) of a process, from its /proc/PID/stat fields after the
    name (clustertrain.procs.proc_stat): the 14th and 15th fields, and the 24th, of the file."""
    return int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE_KB


def gpus(csv: str) -> list[dict[str, float]]:
    """nvidia-smi's ``--query-gpu=index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits`` lines; a GPU whose figures it cannot read ("[N/A]") is left
    out."""
    found = []
    for line in csv.splitlines():
        words = [word.strip() for word in line.split(",")]
        try:
            index, util, used, total = (float(word) for word in words)
        except ValueError:
            continue
        found.append({"index": int(index), "util_pct": util, "mem_used_mib": used,
                      "mem_total_mib": total})  # fmt: skip
    return found


def percent(busy: int, total: int) -> float:
    return round(100.0 * busy / total, 1) if total > 0 else 0.0


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace")


def _nvidia_smi() -> list[dict[str, float]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    argv = [smi, f"--query-gpu={_GPU_QUERY}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=NVIDIA_SMI_WAIT_S)
    except subprocess.TimeoutExpired:
        return []
    return gpus(done.stdout) if done.returncode == 0 else []


def sample(heartbeats: Path, interval_s: float = INTERVAL_S) -> dict[str, Any]:
    """This node's figures, and its ranks' of the step ``heartbeats`` belongs to."""
    ranks = ranks_here(heartbeats)
    before_cpu, before = cpu_times(_read("/proc/stat")), {}
    for found in ranks:
        if fields := proc_stat(found.pid):
            before[found.rank] = process_ticks(fields)[0]
    started = time.monotonic()
    time.sleep(interval_s)
    after_cpu, elapsed = cpu_times(_read("/proc/stat")), time.monotonic() - started
    per_rank = []
    for found in ranks:
        fields = proc_stat(found.pid)
        if not fields or found.rank not in before:
            continue  # it ended meanwhile
        ticks, rss_kb = process_ticks(fields)
        used = (ticks - before[found.rank]) / _TICKS / elapsed
        per_rank.append({"rank": found.rank, "pid": found.pid,
                         "cpu_pct": round(100.0 * used, 1), "rss_kb": rss_kb})  # fmt: skip
    used_kb, total_kb = memory_kb(_read("/proc/meminfo"))
    return {
        "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
        "cpus": os.cpu_count() or 1,
        "cpu_pct": percent(after_cpu[0] - before_cpu[0], after_cpu[1] - before_cpu[1]),
        "mem_used_kb": used_kb,
        "mem_total_kb": total_kb,
        "gpus": _nvidia_smi(),
        "ranks": per_rank,
    }


if __name__ == "__main__":
    print(json.dumps(sample(Path(sys.argv[1]))), flush=True)

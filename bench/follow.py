"""`clustertrain logs JOB --follow` at the scale of a 2,048-node job: latency, CPU and memory.

  python -m bench.follow [--files 1024,16384,65536] [--mode poll,inotify] [--seconds 30]
                         [--rate 100] [--write FILE]

For each size, and at each size each mode (``$CLUSTERTRAIN_FOLLOW``: clustertrain.runs.follow_mode),
a folder laid out as a running job's (``logs/attempt-0/<node>.out|err``, all files there from
the start) is followed by clustertrain's follower in a process of its own, while a writer
process appends ``--rate`` lines a second, each to a file chosen at random, each carrying the
time it was written. The follower's output is read here: every line must arrive; its latency is
arrival minus write time. The follower reports its own CPU time, peak RSS and the mode that ran
(the one asked, unless it said it polls instead). Goal at 65,536 files, 100 lines/s: every
line, p95 under 1 s, under 10 % of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB_ID = "4242"


def follower(logs: Path, done_flag: Path) -> None:
    """The measured side: clustertrain's own follower, until ``done_flag`` exists."""
    from clustertrain.jobstate import JobState
    from clustertrain.runs import Run, follow_mode
    from clustertrain.runs import logs as joblogs

    run = Run(logs.parent, JOB_ID, "bench", "", 1, 1, "torchrun")
    started = time.process_time()

    def state() -> JobState:
        return JobState(JOB_ID, "COMPLETED" if done_flag.exists() else "RUNNING")

    wall = time.monotonic()
    said: list[str] = []
    joblogs.follow(run, joblogs.Filter(), state, sys.stdout, say=said.append)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    mode = follow_mode.mode_for(logs)
    fell_back = any("polling" in line for line in said)
    report = {
        "cpu_s": time.process_time() - started,
        "wall_s": time.monotonic() - wall,
        "max_rss_mb": usage.ru_maxrss / 1024,
        "mode": follow_mode.POLL if fell_back else mode.name,
        "said": said,
    }
    print(json.dumps(report), file=sys.stderr)


def writer(logs: Path, files: int, seconds: float, rate: float) -> None:
    """Appends lines at random, each with its sequence number and the time it was written."""
    paths = [_node_file(logs, k) for k in range(files)]
    rng = random.Random(0)
    start = time.monotonic()
    for seq in range(int(seconds * rate)):
        time.sleep(max(0.0, start + seq / rate - time.monotonic()))
        with open(rng.choice(paths), "a") as handle:
            handle.write(f"[rank{seq % 8}]: line {seq} at {time.time():.6f}\n")


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far (user and system, /proc/PID/stat's utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _node_file(logs: Path, k: int) -> Path:
    return logs / "attempt-0" / f"node{k // 2 + 1}.{('out', 'err')[k % 2]}"


def measure(files: int, mode: str, seconds: float, rate: float) -> dict[str, Any]:
    from clustertrain.runs import follow_mode

    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-follow-") as work:
        logs = Path(work) / "run" / "logs"
        (logs / "attempt-0").mkdir(parents=True)
        for k in range(files):
            _node_file(logs, k).touch()
        done_flag = Path(work) / "done"
        me = [sys.executable, "-m", "bench.follow"]
        follow = subprocess.Popen(
            [*me, "--follower", str(logs), str(done_flag)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, follow_mode.ENV_FOLLOW: mode},
        )  # fmt: skip
        latencies: list[float] = []

        def read() -> None:
            assert follow.stdout is not None
            for line in follow.stdout:
                if " at " in line:
                    latencies.append(time.time() - float(line.rsplit(" at ", 1)[1]))

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(2.0)  # the follower's start-up and first listing are not what is measured
        before, started = _cpu_s(follow.pid), time.monotonic()
        subprocess.run(
            [*me, "--writer", str(logs), str(files), str(seconds), str(rate)], cwd=ROOT, check=True
        )
        writing = (_cpu_s(follow.pid) - before) / (time.monotonic() - started)
        time.sleep(2.0)
        done_flag.touch()
        _, err = follow.communicate(timeout=120)
        reader.join()
        report = json.loads(err.strip().splitlines()[-1])
    latencies.sort()
    return {
        "files": files,
        "mode": report["mode"],
        "said": report["said"],
        "written": int(seconds * rate),
        "seen": len(latencies),
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[int(0.95 * (len(latencies) - 1))],
        "max_s": latencies[-1],
        "cpu_pct": 100 * report["cpu_s"] / report["wall_s"],
        "writing_cpu_pct": 100 * writing,
        "max_rss_mb": report["max_rss_mb"],
    }


def table(rows: list[dict[str, Any]], seconds: float, rate: float, auto: str) -> str:
    lines = [
        f"`python -m bench.follow`: {rate:g} lines/s at random files for {seconds:g} s; "
        "latency = arrival in the follower's output minus write time; CPU = the follower's "
        "CPU time over its wall time, start-up listing and final pass included (one core = "
        "100 %); while writing = its CPU over the writer's seconds alone; mode = the one that "
        f"ran. Here `auto` chooses {auto}.",
        "",
        "| files | mode | lines written | lines seen | median | p95 | max | CPU | while "
        "writing | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['files']:,} | {r['mode']} | {r['written']:,} | {r['seen']:,} | "
            f"{r['p50_s']:.2f} s | {r['p95_s']:.2f} s | {r['max_s']:.2f} s | "
            f"{r['cpu_pct']:.1f} % | {r['writing_cpu_pct']:.1f} % | {r['max_rss_mb']:.0f} MB |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", default="1024,16384,65536")
    parser.add_argument("--mode", default="poll,inotify", help="modes to run, side by side")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    parser.add_argument("--follower", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--writer", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follower:
        follower(Path(args.follower[0]), Path(args.follower[1]))
        return
    if args.writer:
        logs, files, seconds, rate = args.writer
        writer(Path(logs), int(files), float(seconds), float(rate))
        return
    from clustertrain.runs import follow_mode

    rows = []
    for n in args.files.split(","):  # one at a time: the sizes and modes never share the CPU
        for mode in args.mode.split(","):
            rows.append(
                measure(
                    int(n),
                    follow_mode.setting({follow_mode.ENV_FOLLOW: mode}),
                    args.seconds,
                    args.rate,
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="clustertrain-bench-follow-") as work:
        auto = follow_mode.mode_for(Path(work), {})
    text = table(rows, args.seconds, args.rate, f"{auto.name} ({auto.why})")
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

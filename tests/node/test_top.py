"""One node's figures for `clustertrain top` (clustertrain.node.top): /proc's and nvidia-smi's
text parsed by pure functions, and a real sample of real ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain import protocol
from clustertrain.node import top
from tests.conftest import ROOT
from tests.node.test_stacks import start_ranks

STAT = "cpu  100 5 50 800 20 3 2 7 0 0\ncpu0 50 2 25 400 10 1 1 3 0 0\nintr 1 2 3\n"
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8192000 kB\n"


def test_proc_stat_and_meminfo_are_read() -> None:
    # busy: user nice system irq softirq; idle: idle iowait; steal is neither
    assert top.cpu_times(STAT) == (160, 980)
    assert top.percent(40, 200) == 20.0 and top.percent(1, 0) == 0.0
    assert top.memory_kb(MEMINFO) == (8192000, 16384000)
    with pytest.raises(ValueError):
        top.cpu_times("intr 1 2 3\n")


def test_a_process_stat_line_gives_its_cpu_ticks_and_resident_memory() -> None:
    line = "S 1 2 3 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 1000000 2560"
    fields = line.split(" ")
    ticks, rss_kb = top.process_ticks(fields)
    assert ticks == 300 and rss_kb == 2560 * top._PAGE_KB


def test_nvidia_smis_csv_is_read_and_a_gpu_it_cannot_read_left_out() -> None:
    csv = "0, 87, 30512, 81559\n1, [N/A], [N/A], 81559\n"
    assert top.gpus(csv) == [
        {"index": 0, "util_pct": 87.0, "mem_used_mib": 30512.0, "mem_total_mib": 81559.0}
    ]


def test_a_sample_names_this_node_and_each_rank_with_its_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = start_ranks(tmp_path, ["beat", "hang"])
    try:
        monkeypatch.setenv("SLURMD_NODENAME", "node1")
        said = top.sample(tmp_path / protocol.HEARTBEAT_DIR, interval_s=0.3)
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert said["node"] == "node1" and said["mem_total_kb"] > said["mem_used_kb"] > 0
    by_rank = {r["rank"]: r for r in said["ranks"]}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0]["cpu_pct"] > 20 > by_rank[1]["cpu_pct"], by_rank  # the busy one shows
    assert by_rank[0]["rss_kb"] > 1000 and by_rank[0]["pid"] == ranks[0].pid


def test_the_node_module_prints_one_json_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain.node.top", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.count("\n") == 1 and '"ranks": []' in done.stdout

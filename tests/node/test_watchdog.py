"""The hang watchdog on real processes: ranks that beat through clustertrain.runtime and then
stop, their stacks taken by faulthandler on the dump signal, a stand-in for srun ended.

Slurm's part (srun running clustertrain.node.stacks on every node) is stood in for by a fake
``srun`` that runs it here; the real path runs in tests/e2e/test_hang_e2e.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain import protocol
from clustertrain.node import frames, watchdog
from tests.conftest import ROOT

RANK = """
import os, sys, threading, time
from clustertrain import runtime

def wait_in_collective(done):
    done.close(); threading.Event().wait()   # a rank blocked where its peers never arrive

def sleep_forever(done):
    done.close(); time.sleep(3600)           # the odd rank out

for step in range(1, 4):
    runtime.heartbeat(step)
    time.sleep(0.4)
# Beating done, said from where the rank blocks (not before it gets there: a stack taken in
# between would name the module, not the function).
(sleep_forever if sys.argv[1] == "1" else wait_in_collective)(open(sys.argv[2], "w"))
"""


@pytest.fixture
def ranks(tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    """Three ranks that beat, then hang: rank 1 in sleep_forever, ranks 0 and 2 in a wait."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    started = []
    for rank in range(3):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "SLURMD_NODENAME": "node1",
            protocol.ENV_HEARTBEAT_DIR: str(tmp_path / "beats"),
        }
        argv = [sys.executable, str(script), str(rank), str(tmp_path / f"done-{rank}")]
        started.append(subprocess.Popen(argv, cwd=ROOT, env=env))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"done-{r}").exists() for r in range(3)):
        assert time.monotonic() < deadline, "the ranks never finished beating"
        time.sleep(0.1)
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_hang_is_declared_with_every_ranks_place_and_the_step_ended(
    ranks: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun's options, then the command, run on this "node"
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n'
    )
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv(protocol.ENV_EVENTS_FILE, str(tmp_path / "events.jsonl"))
    srun = subprocess.Popen(["sleep", "300"])  # stands in for srun
    folder = tmp_path / "beats"
    watchdog.watch(folder, timeout_s=1.0, srun_pid=srun.pid, poll_s=0.2)

    said = (folder / protocol.HANG_FILE).read_text()
    stacks = "\n".join((folder / f"rank-{rank}.stack").read_text() for rank in range(3))
    assert said.startswith("hang at step 3: no rank made progress for "), said + stacks
    assert "ranks 0, 2 in wait (rank.py:6)" in said, said + stacks
    assert "rank 1 in sleep_forever (rank.py:9)" in said, said + stacks
    assert said.endswith(" (stacks by faulthandler for ranks 0-2)\n"), said + stacks
    for rank in range(3):
        assert "(most recent call first)" in (folder / f"rank-{rank}.stack").read_text()
    assert srun.wait(5) == -signal.SIGTERM  # the step was ended
    assert '"event": "hang"' in (tmp_path / "events.jsonl").read_text()


def test_a_step_whose_ranks_never_beat_is_never_declared_hung(tmp_path: Path) -> None:
    (tmp_path / "node1.out").write_text("quiet for long, but nobody asked to watch output\n")
    os.utime(tmp_path / "node1.out", (0, 0))
    srun = subprocess.Popen(["sleep", "1.5"])
    watchdog.watch(tmp_path / "beats", timeout_s=0.2, srun_pid=srun.pid, poll_s=0.1)
    assert srun.wait(5) == 0 and not (tmp_path / "beats").exists()


def test_with_quiet_output_counts_as_progress_and_its_silence_is_a_hang(tmp_path: Path) -> None:
    """hang_on_quiet, for scripts without the runtime library: the node logs' last line."""
    (tmp_path / "node1.err").write_text("launcher: starting\n")  # a launcher's own: start-up
    assert watchdog.progress(tmp_path / "beats", quiet=True) == ({}, None)
    (tmp_path / "node1.out").write_text("[rank0]: step 29\n")
    steps, newest = watchdog.progress(tmp_path / "beats", quiet=True)
    assert steps == {} and newest == (tmp_path / "node1.out").stat().st_mtime
    assert watchdog.progress(tmp_path / "beats", quiet=False) == ({}, None)
    os.utime(tmp_path / "node1.out", (time.time() - 60, time.time() - 60))
    srun = subprocess.Popen(["sleep", "300"])
    watchdog.watch(tmp_path / "beats", timeout_s=30, srun_pid=srun.pid, quiet=True, poll_s=0.1)
    assert srun.wait(5) == -signal.SIGTERM
    said = (tmp_path / "beats" / protocol.HANG_FILE).read_text()
    assert said.startswith("hang: no rank made progress for 60 s; ")


def test_where_reads_py_spys_stacks_too() -> None:
    stack = (
        "Process 27300: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 27301 (idle): "pt_gloo_runloop"\n    run (/usr/lib/python3.11/threading.py:975)\n\n'
        'Thread 27300 (idle): "MainThread"\n'
        "    all_reduce (/v/lib/python3.11/site-packages/torch/distributed/c10d.py:2501)\n"
        "    step (/home/me/train.py:40)\n    <module> (/home/me/train.py:52)\n"
    )
    assert frames.where(stack) == "all_reduce (train.py:40)"


def test_where_reads_a_module_run_with_python_m_and_not_a_dump_cut_halfway() -> None:
    """`python -m jobs.mnist.train`: runpy's frames sit below the module's. A dump whose frames
    are not written yet names no place, so the watchdog waits for the rest of it."""
    stack = (
        "Thread 0x00007f94e8677b80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n\n'
        "Current thread 0x00007f163a442b80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 629 in wait\n'
        '  File "/home/me/jobs/mnist/train.py", line 3 in step\n'
        '  File "/home/me/jobs/mnist/train.py", line 4 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
        '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
    )
    assert frames.where(stack) == "wait (train.py:3)"
    assert frames.where("Current thread 0x00007f163a442b80 (most recent call first):\n") is None


def test_rank_lists_and_a_rank_that_did_not_answer(tmp_path: Path) -> None:
    (tmp_path / "rank-0.stack").write_text("")
    found = {0: 5, 1: 7, 2: 7}
    said = watchdog.summary(tmp_path, found, 8.0)
    quiet = "hang at step 7: no rank made progress for 8 s"
    assert said == f"{quiet}; ranks 0-2 in no stack (it did not answer)"
    assert protocol.rank_list([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"

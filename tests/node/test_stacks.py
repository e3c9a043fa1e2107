"""Taking every rank's stack on one node (clustertrain.node.stacks) from real processes: ranks
with the runtime library answer the dump signal, the others are py-spy's; only the processes
found as the step's ranks on this node are asked, and a `stacks` call leaves the watchdog's
next stack its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import protocol
from clustertrain.node import frames, stacks
from tests.conftest import ROOT

RANK = """
import sys, threading, time
from clustertrain import runtime

def wait_in_collective():
    threading.Event().wait()                  # a rank blocked where its peers never arrive

def sleep_forever():
    time.sleep(3600)                          # the odd rank out

rank, mode, done = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if mode == "plain":                           # no runtime library: no heartbeat, no signal
    open(done, "w").close(); wait_in_collective()
for step in range(1, 4):
    runtime.heartbeat(step, samples=4)
    time.sleep(0.05)
open(done, "w").close()
if mode == "beat":                            # training on: steps, samples and CPU that move
    step = 3
    while True:
        step += 1
        runtime.heartbeat(step, samples=4)
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
(sleep_forever if rank == 1 else wait_in_collective)()
"""


def start_ranks(
    folder: Path, modes: list[str], node: str = "node1", extra: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """Processes that look like a step's ranks on ``node`` (the launcher's variables, the
    heartbeat folder), each in ``modes[rank]``; returned once each has beaten (or started)."""
    script = folder / "rank.py"
    folder.mkdir(parents=True, exist_ok=True)
    script.write_text(RANK)
    beats = folder / protocol.HEARTBEAT_DIR
    started = []
    for rank, mode in enumerate(modes):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "4",
               "SLURMD_NODENAME": node, protocol.ENV_HEARTBEAT_DIR: str(beats),
               "PYTHONPATH": str(ROOT), **(extra or {})}  # fmt: skip
        argv = [sys.executable, str(script), str(rank), mode, str(folder / f"done-{rank}")]
        started.append(subprocess.Popen(argv, cwd=folder, env=env))
    deadline = time.monotonic() + 60
    while not all((folder / f"done-{r}").exists() for r in range(len(modes))):
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    time.sleep(0.3)  # from done to where they block
    return started


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started = start_ranks(tmp_path, ["hang", "hang", "hang", "plain"])
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_each_rank_of_this_node_is_found_and_its_stack_taken_without_stopping_it(
    ranks: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no py-spy here: said so, not an error
    beats = tmp_path / protocol.HEARTBEAT_DIR
    assert [(f.pid, f.rank) for f in stacks.ranks_here(beats)] == [
        (p.pid, r) for r, p in enumerate(ranks)
    ]
    taken = stacks.take(beats, tmp_path / "out")
    assert taken == {0: "faulthandler", 1: "faulthandler", 2: "faulthandler", 3: "none"}
    said = {rank: (tmp_path / "out" / f"rank-{rank}.stack").read_text() for rank in range(4)}
    assert frames.where(said[1]) == "sleep_forever (rank.py:9)"
    assert frames.where(said[0]) == "wait (rank.py:6)"
    assert said[3].startswith("no stack: py-spy is not installed on this node")
    assert all(proc.poll() is None for proc in ranks)  # nothing stopped
    # Asked again, each stack is one dump: the new one, not the first one again.
    stacks.take(beats, tmp_path / "again")
    again = (tmp_path / "again" / "rank-1.stack").read_text()
    assert again.count("Current thread") == 1 and frames.where(again) == frames.where(said[1])


def test_ranks_of_another_node_or_step_are_left_alone(
    ranks: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    assert stacks.ranks_here(tmp_path / protocol.HEARTBEAT_DIR) == []
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    assert stacks.ranks_here(tmp_path / "another-step" / protocol.HEARTBEAT_DIR) == []
    assert stacks.take(tmp_path / "another-step", tmp_path / "out") == {}

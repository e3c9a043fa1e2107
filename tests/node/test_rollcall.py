"""The roll call of a job with spare nodes, on real processes: beacons that go quiet, a stand-in
for srun that answers for some nodes and not others, the watchdog ending the step and naming
the lost node, and the batch script's arithmetic afterwards. The real path (a node killed on
the local cluster, the step back on a spare) runs in tests/e2e/test_spare_nodes_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain import events, protocol
from clustertrain.node import rollcall, watchdog
from tests.conftest import ROOT

# srun as the roll call runs it: `srun --overlap ... --nodelist=NODE true`. node2 is gone
# (srun says so and fails, as Slurm's does for a killed node); node9 never answers.
FAKE_SRUN = """#!/bin/sh
for word in "$@"; do
    case "$word" in
        --nodelist=node2) echo "srun: error: Task launch for StepId=7.3 failed on node node2: \
Communication connection failure" >&2; exit 1 ;;
        --nodelist=node9) exec sleep 60 ;;
    esac
done
exit 0
"""


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake srun and squeue/scancel that record their calls; the events file of a job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    calls = tmp_path / "calls"
    for name in ("squeue", "scancel"):
        reply = "7.0\\n7.batch\\n7.extern" if name == "squeue" else ""
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nprintf "{reply}"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv(protocol.ENV_EVENTS_FILE, str(tmp_path / "events.jsonl"))
    return calls


def test_the_roll_call_names_the_nodes_that_fail_or_do_not_answer(slurm: Path) -> None:
    lost = rollcall.call(["node1", "node2", "node3", "node9"], answer_s=2.0)
    failed = "Task launch for StepId=7.3 failed on node node2: Communication connection failure"
    assert lost == {"node2": failed, "node9": "no answer in 2 s"}


def test_a_quiet_beacon_is_a_suspicion_and_a_node_that_never_beat_counts_from_the_start(
    tmp_path: Path,
) -> None:
    for node, age in (("node1", 0.0), ("node2", 10.0)):
        beacon = tmp_path / f"{protocol.BEACON_PREFIX}{node}"
        beacon.touch()
        os.utime(beacon, (time.time() - age, time.time() - age))
    now = time.time()
    assert set(rollcall.silent(tmp_path, ["node1", "node2", "node3"], now)) == {"node2"}
    assert set(rollcall.silent(tmp_path, ["node1", "node3"], now - 10)) == {"node3"}


def test_the_watchdog_ends_the_step_of_a_lost_node_and_names_it(
    slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "heartbeats"
    folder.mkdir()
    monkeypatch.setenv(protocol.ENV_ACTIVE_NODES, "node1,node2")
    srun = subprocess.Popen(["sleep", "30"])  # stands in for the step's srun
    beating = subprocess.Popen(  # node1 beats; node2 never does
        ["sh", "-c", f"while : >{folder}/{protocol.BEACON_PREFIX}node1; do sleep 0.2; done"]
    )
    try:
        watchdog.watch(folder, timeout_s=600, srun_pid=srun.pid, poll_s=0.2)
    finally:
        beating.kill()
        beating.wait()
    assert (folder / protocol.LOST_FILE).read_text() == "node2\n"
    assert srun.wait(10) in (-signal.SIGTERM, -signal.SIGKILL)
    # Its tasks on the healthy node are ended through Slurm; the batch step is not touched.
    deadline = time.monotonic() + 10
    while "scancel" not in slurm.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "scancel --signal=KILL 7.0\n" in slurm.read_text()
    (lost,) = [e for e in events.read(tmp_path / "events.jsonl") if e.name == "node_lost"]
    assert lost.values["nodes"] == "node2" and lost.values["seconds"] > rollcall.QUIET_S


def test_a_node_that_answers_the_roll_call_is_not_lost(
    slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node3's beacon is quiet (its launcher ended first), but it answers: the step goes on."""
    monkeypatch.setenv(protocol.ENV_ACTIVE_NODES, "node1,node3")
    srun = subprocess.Popen(["sleep", "3"])
    watchdog.watch(tmp_path / "heartbeats", timeout_s=600, srun_pid=srun.pid, poll_s=0.2)
    assert srun.wait() == 0
    assert not (tmp_path / "heartbeats" / protocol.LOST_FILE).exists()


def test_a_local_run_refuses_spare_nodes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clustertrain", "run", "--spare-nodes", "1", "--no-prepare"],
        cwd=ROOT,
        env={**os.environ, "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("clustertrain: error: spare_nodes: 1: a local run has one node")
    assert not (tmp_path / "runs").exists()

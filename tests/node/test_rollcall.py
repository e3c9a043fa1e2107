"""The roll call of a job with spare nodes, on real processes: beacons that go quiet, a stand-in
for srun that answers for some nodes and not others, the watchdog ending the step and naming
the lost node, and the batch script's arithmetic afterwards. The real path (a node killed on
the local cluster, the step back on a spare) runs in tests/e2e/test_spare_nodes_e2e.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain import events, protocol
from clustertrain.node import rollcall, watchdog
from tests.conftest import ROOT

# srun as the roll call runs it: `srun --overlap ... --nodelist=NODE true`. node2 is gone
# (srun says so and fails, as Slurm's does for a killed node); node9 and node5 never answer.
FAKE_SRUN = """#!/bin/sh
for word in "$@"; do
    case "$word" in
        --nodelist=node2) echo "srun: error: Task launch for StepId=7.3 failed on node node2: \
Communication connection failure" >&2; exit 1 ;;
        --nodelist=node9|--nodelist=node5) exec sleep 60 ;;
    esac
done
exit 0
"""


# scontrol show node: Slurm has no address for these nodes (the roll call asks srun), but
# node5's slurmd is at a port where nothing listens (the node was killed: refused at once).
FAKE_SCONTROL = """#!/bin/sh
case "$4" in
    node5) echo "NodeName=node5 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=node5 Port={port}" ;;
esac
"""


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake srun, scontrol and squeue/scancel (which record their calls); the events file of
    a job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(port=_closed_port()))
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
    lost = rollcall.call(["node1", "node2", "node3", "node9", "node5"], answer_s=2.0)
    failed = "Task launch for StepId=7.3 failed on node node2: Communication connection failure"
    why = lost.pop("node5")  # srun was not asked: it would not have answered (no answer in 2 s)
    assert why.startswith("its slurmd (127.0.0.1:") and why.endswith(") refused the connection")
    assert lost == {"node2": failed, "node9": "no answer in 2 s"}


def test_a_slurmd_that_accepts_is_there_one_that_refuses_is_lost_and_a_bad_address_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert rollcall.knock("127.0.0.1", listening.getsockname()[1]) == ""
    port = _closed_port()
    assert (
        rollcall.knock("127.0.0.1", port) == f"its slurmd (127.0.0.1:{port}) refused the connection"
    )
    for said in ("NodeAddr=-oProxyCommand=x Port=6818", "NodeAddr=node1 Port=68a",
                 "NodeAddr=node1 Port=70000", "NodeAddr=node1", ""):  # fmt: skip
        monkeypatch.setattr(subprocess, "run", lambda *a, s=said, **k: _Done(s))
        assert rollcall.slurmd_address("node1") is None, said
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: _Done("NodeAddr=10.77.0.3 Port=16819"))
    assert rollcall.slurmd_address("node2") == ("10.77.0.3", 16819)


class _Done:
    def __init__(self, stdout: str) -> None:
        self.stdout, self.returncode = stdout, 0


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

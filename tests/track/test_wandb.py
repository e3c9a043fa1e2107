"""W&B offline: a real script logs through the real ``wandb`` library, offline, into the run
folder (WANDB_DIR, as the batch script of an ``offline: true`` job sets it); the relay then
calls ``wandb sync <offline run>`` once. No W&B server here: ``wandb`` on PATH is a stub that
records its argv, and the test stops at that exact call."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.track import make, relay
from tests.track.conftest import write

SCRIPT = textwrap.dedent(
    """
    import wandb
    run = wandb.init(project="clustertrain-test", config={"lr": 0.1})
    for step in range(5):
        wandb.log({"test_acc": step / 10}, step=step)
    run.finish()
    """
)


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``wandb`` on PATH: appends its argv, a line per call, to the returned file."""
    calls, bin_dir = tmp_path / "wandb-calls", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wandb").write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\n')
    (bin_dir / "wandb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_offline_runs_synced_once_each(run: runs.Run, stub: Path) -> None:
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(run.path), "WANDB_SILENT": "1"}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=300)
    (offline,) = (run.path / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))  # what wandb sync uploads
    write(run, "ended", status="0")
    said: list[str] = []
    relay(run, make("wandb", run, say=said.append), said.append)
    assert stub.read_text().splitlines() == [f"sync {offline}"]
    assert f"wandb: synced {offline}" in said
    relay(run, make("wandb", run, say=said.append), said.append)
    assert len(stub.read_text().splitlines()) == 1  # not again


def test_a_folder_leading_out_of_the_run_folder_is_refused(
    run: runs.Run, stub: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    root = run.path / "wandb"
    root.mkdir()
    (root / "offline-run-20260101_000000-linked").symlink_to(outside)
    holder = root / "offline-run-20260101_000001-holder"
    (holder / "files").mkdir(parents=True)
    (holder / "files" / "key").symlink_to(Path.home() / ".ssh" / "id_rsa")
    (root / "offline-run-20260101_000002-fine").mkdir()
    write(run, "ended", status="0")
    said: list[str] = []
    relay(run, make("wandb", run, say=said.append), said.append)
    assert stub.read_text().splitlines() == [f"sync {root / 'offline-run-20260101_000002-fine'}"]
    assert any("linked is a link" in line for line in said)
    assert any("holder holds" in line and "a link out of the run folder" in line for line in said)


def test_a_wandb_folder_that_is_a_link_is_refused(
    run: runs.Run, stub: Path, tmp_path: Path
) -> None:
    (tmp_path / "other" / "offline-run-20260101_000000-x").mkdir(parents=True)
    (run.path / "wandb").symlink_to(tmp_path / "other")
    write(run, "ended", status="0")
    said: list[str] = []
    relay(run, make("wandb", run, say=said.append), said.append)
    assert not stub.exists() and any("is a symlink" in line for line in said)

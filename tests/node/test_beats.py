"""The ranks' heartbeats read (clustertrain.node.beats), the one reader of the watchdog and of
`clustertrain top`: as input that anyone who can write the run folder may have crafted."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from clustertrain import protocol
from clustertrain.node import beats, watchdog


def _beat(folder: Path, rank: str, line: str, node: str | None = "node1") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}").write_text(line)
    if node is not None:
        (folder / f"rank-{rank}.node").write_text(node + "\n")


def _line(step: int, compute: str = "1.500000", samples: int = 64) -> str:
    """As the runtime writes it (rank.runtime: three fields of 20)."""
    return f"{step:>20} {compute:>20} {samples:>20}\n"


def test_a_forged_heartbeat_is_left_out_and_an_older_runtimes_line_read(tmp_path: Path) -> None:
    folder = tmp_path / "logs" / "attempt-0" / "heartbeats"
    _beat(folder, "0", _line(7))
    _beat(folder, "1", f"{3:>20} {0.5:>20.6f}\n", node="node[1-2]")  # no samples; no name
    _beat(folder, "2", "x\n")
    _beat(folder, "4", "")  # opened, not yet written
    os.symlink("/etc/passwd", folder / "rank-3")
    found = beats.read(folder, tmp_path)
    assert sorted(found) == [0, 1]
    assert found[0] == beats.Beat(0, "node1", 7, found[0].time, 1.5, 64)
    assert found[0].time == (folder / "rank-0").stat().st_mtime
    assert (found[1].step, found[1].compute_s, found[1].samples, found[1].node) == (3, 0.5, 0, "?")


def test_a_symlinked_heartbeat_or_folder_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _beat(elsewhere, "0", _line(7))
    run = tmp_path / "run"
    _beat(run / "heartbeats", "1", _line(3))
    os.symlink(elsewhere / "rank-0", run / "heartbeats" / "rank-0")
    assert sorted(beats.read(run / "heartbeats")) == [1]
    (run / "logs").symlink_to(elsewhere)  # a folder below the run folder swapped for a link
    assert beats.read(run / "logs", within=run) == {}
    assert sorted(beats.read(run / "heartbeats", within=run)) == [1]


def test_a_10_mb_heartbeat_is_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _beat(tmp_path, "0", _line(7) + " " * (10 << 20))  # a good line, and then 10 MB
    read: list[int] = []
    opened = beats.open_regular

    class Counted(io.BufferedReader):
        def read(self, size: Any = -1) -> bytes:
            data = super().read(size)
            read.append(len(data))
            return data

    def counted(path: Path, within: Path | None = None) -> io.BufferedReader:
        return Counted(opened(path, within).detach())  # type: ignore[attr-defined]

    monkeypatch.setattr(beats, "open_regular", counted)
    assert beats.read(tmp_path) == {}
    assert read and sum(read) <= beats.BEAT_BYTES + 1


def test_a_compute_total_that_is_no_finite_number_counts_as_none(tmp_path: Path) -> None:
    for rank, compute in enumerate(["nan", "inf", "-inf", "1e999"]):
        _beat(tmp_path, str(rank), _line(5, compute))
    found = beats.read(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {beat.compute_s for beat in found.values()} == {0.0}
    assert {beat.step for beat in found.values()} == {5}


def test_a_node_file_that_names_no_node_leaves_the_node_unknown(tmp_path: Path) -> None:
    names = ["node[1-2]", "-x", "node1 node2", "node1\nnode2", "n" * 65, "", "x" * 200]
    for rank, name in enumerate(names):
        _beat(tmp_path, str(rank), _line(rank), node=name)
    _beat(tmp_path, "99", _line(1), node=None)
    (tmp_path / "rank-99.node").write_bytes(b"node\xff\n")  # not UTF-8
    known: dict[int, str] = {}
    found = beats.read(tmp_path, nodes=known)
    assert sorted(found) == [*range(len(names)), 99]
    assert {beat.node for beat in found.values()} == {beats.UNKNOWN} and known == {}
    assert protocol.NODE_NAME.fullmatch(beats.UNKNOWN) is None  # never taken for a node


def test_a_missing_node_file_is_read_once_it_is_there_and_then_not_again(tmp_path: Path) -> None:
    _beat(tmp_path, "0", _line(3), node=None)  # the runtime writes it just after the heartbeat
    known: dict[int, str] = {}
    assert beats.read(tmp_path, nodes=known)[0].node == beats.UNKNOWN and known == {}
    (tmp_path / "rank-0.node").write_text("node4\n")
    assert beats.read(tmp_path, nodes=known)[0].node == "node4" and known == {0: "node4"}
    (tmp_path / "rank-0.node").unlink()  # the watchdog's poll reads each node's name once
    assert beats.read(tmp_path, nodes=known)[0].node == "node4"
    assert beats.read(tmp_path)[0].node == beats.UNKNOWN


def test_a_rank_number_too_large_or_spelled_twice_is_no_heartbeat(tmp_path: Path) -> None:
    for rank in ["999999", "1000000", "99999999999999999999999", "007", "0", "-1", "1.5"]:
        _beat(tmp_path, rank, _line(1))
    assert sorted(beats.read(tmp_path)) == [0, 999999]
    assert beats.read(tmp_path / "no-such-folder") == {}


def test_the_watchdog_counts_a_rank_without_a_node_and_scores_it_only_once_named(
    tmp_path: Path,
) -> None:
    _beat(tmp_path, "0", _line(9), node=None)
    steps, newest = watchdog.progress(tmp_path, quiet=False)
    assert steps == {0: 9} and newest == (tmp_path / "rank-0").stat().st_mtime
    watched = watchdog.Stragglers(2.0, replace=False)
    assert watched.poll(tmp_path, srun_pid=os.getpid()) is False
    assert watched.nodes == {} and watched.scorer.history == {}
    (tmp_path / "rank-0.node").write_text("node2\n")
    assert watched.poll(tmp_path, srun_pid=os.getpid()) is False
    assert watched.nodes == {0: "node2"} and watched.scorer.history[0][-1].step == 9

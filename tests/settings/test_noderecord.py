"""The node record (clustertrain.settings.noderecord) and `clustertrain nodes`: what run folders
say of bad nodes, read only from your own folders; a forged record or node name refused in one
line; a cleared node not taken again from old events; the dry run's --exclude and why."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.rank import events
from clustertrain.settings import noderecord
from tests.conftest import run_cli


def _run(root: Path, name: str, *lines: dict[str, object]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / protocol.RECORD_FILE).write_text(json.dumps({"job_id": name.split("-")[-1]}))
    with open(folder / protocol.EVENTS_FILE, "w") as handle:
        for line in lines:
            handle.write(json.dumps({"time": time.time(), "attempt": 0, **line}) + "\n")
    return folder


def test_flagged_and_lost_nodes_of_your_runs_are_harvested_and_forged_names_left_out(
    tmp_path: Path,
) -> None:
    _run(tmp_path, "a-12", {"event": events.FLAGGED, "nodes": "node3", "why": "link 1 MiB/s"})
    _run(tmp_path, "b-13", {"event": events.NODE_LOST, "nodes": "node2,-x,node[1-"})
    _run(tmp_path, "c-14", {"event": events.FLAGGED, "nodes": "--exclude=all", "why": "x"})
    found = {e.node: (e.why, e.job) for e in noderecord.harvest(tmp_path)}
    assert found == {"node3": ("flagged: link 1 MiB/s", "12"), "node2": ("lost mid-job", "13")}


def test_a_run_folder_you_do_not_own_adds_nothing(tmp_path: Path) -> None:
    folder = _run(tmp_path, "a-12", {"event": events.FLAGGED, "nodes": "node3", "why": "x"})
    os.chown(folder / protocol.EVENTS_FILE, 65534, 65534)  # nobody's, as in a shared runs root
    assert noderecord.harvest(tmp_path) == []


def test_a_cleared_node_is_not_taken_again_from_events_before_the_clear(tmp_path: Path) -> None:
    _run(tmp_path, "a-12", {"event": events.FLAGGED, "nodes": "node3", "why": "x"})
    record = noderecord.merged(noderecord.Record([], {}), noderecord.harvest(tmp_path))
    assert [e.node for e in record.entries] == ["node3"]
    cleared = noderecord.clear(record, ["node3"], now=time.time() + 1)
    again = noderecord.merged(cleared, noderecord.harvest(tmp_path))
    assert again.entries == [] and "node3" in again.cleared


def test_an_expired_entry_excludes_nothing() -> None:
    old = noderecord.Entry("node3", "x", "12", until=time.time() - 1)
    assert noderecord.current([old]) == []


@pytest.mark.parametrize(
    "text",
    [
        '[{"node": "node3"}]',
        '{"entries": [{"node": "-x", "why": "", "job": "1", "until": 9e9}], "cleared": {}}',
        '{"entries": [{"node": "a\\nb", "why": "", "job": "1", "until": 9e9}], "cleared": {}}',
        '{"entries": [{"node": "node[1-", "why": "", "job": "1", "until": 9e9}], "cleared": {}}',
        '{"entries": [], "cleared": {"-x": 1}}',
        '{"entries": [{"node": "n", "why": "", "job": "1", "until": "soon"}], "cleared": {}}',
        "not json",
    ],
)
def test_a_forged_or_corrupt_record_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "default.json"
    path.write_text(text)
    with pytest.raises(UserError, match=r"^node record: .* is not one") as refused:
        noderecord.load(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("text", ["7", "0d", "1s", "367d", "3 d", "-1h", "99999999d"])
def test_an_expiry_that_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=r"^expire: "):
        noderecord.duration(text)
    assert noderecord.duration("12h") == 43200


def _record(config: Path, *entries: dict[str, object]) -> None:
    folder = config / "clustertrain" / "nodes"
    folder.mkdir(parents=True)
    (folder / "default.json").write_text(json.dumps({"entries": list(entries), "cleared": {}}))


def test_the_dry_run_excludes_the_record_s_nodes_and_says_why_unless_told_not_to(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config"
    _record(config, {"node": "node3", "why": "flagged: link 1.2 MiB/s", "job": "12",
                     "until": time.time() + 3600})  # fmt: skip
    env = {"XDG_CONFIG_HOME": str(config), "SLURM_CONF": str(tmp_path / "none.conf")}
    base = ["submit", "--nodes", "2", "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
    shown = run_cli(*base, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "#SBATCH --exclude=node3\n" in shown.stdout
    assert "excluded by your node record (`clustertrain nodes`): node3: flagged: link 1.2 MiB/s " \
        "(job 12; until " in shown.stdout  # fmt: skip
    told = run_cli(*base, "--exclude", "node4", "--no-avoid-bad-nodes", env=env)
    assert "#SBATCH --exclude=node4\n" in told.stdout and "node3" not in told.stdout
    listed = run_cli("nodes", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert listed.stdout.startswith("node3: flagged: link 1.2 MiB/s (job 12; until ")
    cleared = run_cli("nodes", "clear", "node3", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert cleared.stdout == "cleared: node3\n"
    assert "--exclude" not in run_cli(*base, env=env).stdout
    assert not (tmp_path / "runs").exists()  # the dry runs wrote nothing


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--nodes", "2", "--exclude=-x", "--dry-run"],
        ["submit", "--nodes", "2", "--exclude", "node[1-4]", "--dry-run"],
        ["submit", "--nodes", "2", "--exclude", "node3\n", "--dry-run"],
        ["submit", "--nodes", "2", "--qualify-threshold", "0", "--dry-run"],
        ["submit", "--nodes", "2", "--qualify-threshold", "-2", "--dry-run"],
        ["submit", "--nodes", "2", "--qualify-threshold", "inf", "--dry-run"],
        ["submit", "--nodes", "2", "--on-flagged", "ignore", "--dry-run"],
        ["nodes", "clear", "--", "-x"],
        ["nodes", "clear", "node[1-"],
        ["nodes", "clear", "a\nb"],
        ["cluster", "degrade", "node3", "--link-rate", "10"],
        ["cluster", "degrade", "node3", "--link-rate", "200gbit"],
        ["cluster", "degrade", "node3", "--cpu", "0%"],
        ["cluster", "degrade", "node3", "--cpu", "101%"],
        ["cluster", "degrade", "node3", "--cpu", "25"],
        ["cluster", "degrade", "node3"],
    ],
)
def test_bad_values_are_refused_in_one_line_with_status_2_and_nothing_written(
    tmp_path: Path, argv: list[str]
) -> None:
    done = run_cli(*argv, env={"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("clustertrain: error: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()


# Issue 49: a record that is not yours alone, or not one, is ignored with one warning, never
# obeyed; the writer never writes what the reader would refuse.


def _dry_run(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = {"XDG_CONFIG_HOME": str(config), "SLURM_CONF": str(tmp_path / "none.conf")}
    return run_cli("submit", "--nodes", "2", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                   env=env)  # fmt: skip


@pytest.mark.parametrize("how", ["group-writable", "another user's", "corrupt", "a symlink"])
def test_a_record_not_yours_alone_or_not_one_is_ignored_with_one_warning(
    tmp_path: Path, how: str
) -> None:
    config = tmp_path / "config"
    _record(config, {"node": "node3", "why": "x", "job": "12", "until": time.time() + 3600})
    path = config / "clustertrain" / "nodes" / "default.json"
    if how == "group-writable":
        path.chmod(0o664)
    elif how == "another user's":
        os.chown(path, 65534, 65534)
    elif how == "corrupt":
        path.write_text('{"entries": [{"node": "--exclude=all"}], "cleared": {}}')
    else:
        path.rename(tmp_path / "elsewhere.json")
        path.symlink_to(tmp_path / "elsewhere.json")
    shown = _dry_run(tmp_path, config)
    assert shown.returncode == 0, shown.stderr
    assert "--exclude" not in shown.stdout and "node3" not in shown.stdout
    warned = [line for line in shown.stderr.splitlines() if "node record" in line]
    assert len(warned) == 1 and warned[0].startswith("clustertrain: warning: ignoring your node")


def test_the_writer_keeps_the_record_within_what_the_reader_takes(tmp_path: Path) -> None:
    now = time.time()
    many = [noderecord.Entry(f"node{i}", "x" * 400, "1" * 80, now + 60 + i) for i in range(1500)]
    cleared = {f"node{i}": now - 60 - i for i in range(1500)}
    cleared["old1"] = now - noderecord.EXPIRY_S - 1
    path = tmp_path / "nodes" / "default.json"
    noderecord.save(path, noderecord.Record(many, cleared), now)
    back = noderecord.load(path)
    assert len(back.entries) == noderecord.MAX_ENTRIES == len(back.cleared)
    assert min(e.until for e in back.entries) == now + 60 + 500  # the longest-lasting kept
    assert "node0" in back.cleared and "old1" not in back.cleared  # the newest clears kept
    assert path.stat().st_mode & 0o777 == 0o600


def test_clearing_all_of_a_broken_record_leaves_a_valid_one(tmp_path: Path) -> None:
    config = tmp_path / "config"
    _record(config)
    path = config / "clustertrain" / "nodes" / "default.json"
    path.write_text("{nope")
    env = {"XDG_CONFIG_HOME": str(config), "SLURM_CONF": str(tmp_path / "none.conf")}
    done = run_cli("nodes", "clear", "--all", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert done.returncode == 0, done.stderr
    assert noderecord.load(path).entries == []


@pytest.mark.parametrize("how", ["a file", "another user's folder"])
def test_a_config_folder_that_cannot_hold_the_record_is_one_line(tmp_path: Path, how: str) -> None:
    config = tmp_path / "config"
    if how == "a file":
        config.write_text("")
    else:
        (config / "clustertrain" / "nodes").mkdir(parents=True)
        os.chown(config / "clustertrain" / "nodes", 65534, 65534)
    env = {"XDG_CONFIG_HOME": str(config), "SLURM_CONF": str(tmp_path / "none.conf")}
    done = run_cli("nodes", "clear", "node3", "--runs-dir", str(tmp_path / "runs"), env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("clustertrain: error: node record: ")
    assert "Traceback" not in done.stderr
    assert _dry_run(tmp_path, config).returncode == 0

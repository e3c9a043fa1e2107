"""Run folders are their user's alone (they hold the code, logs and checkpoints), unless the runs
root is a team's (setgid): then the group reads them. The real two-user case is
tests/e2e/test_users_e2e.py."""

from __future__ import annotations

import stat
from pathlib import Path

from clustertrain import runs
from clustertrain.render import render
from tests.conftest import job_spec


def _written(root: Path) -> Path:
    job = render(job_spec(nodes=1), str(root / "job-1"), "/work")
    return runs.write_run_files(job)


def test_a_run_folder_and_a_new_runs_root_are_private_whatever_the_umask(tmp_path: Path) -> None:
    folder = _written(tmp_path / "new-root")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700


def test_in_a_teams_setgid_runs_root_the_group_reads_and_writes_nothing(tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    folder = _written(team)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o2750


def test_a_private_file_is_its_users_alone_even_in_a_teams_runs_root(tmp_path: Path) -> None:
    """What only the user may read (a notebook's pickled call), in a folder the group reads."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    job = render(job_spec(nodes=1), str(team / "job-1"), "/work")
    folder = runs.write_run_files(job, private={"call.pkl": b"\x80\x05."})
    assert (folder / "call.pkl").read_bytes() == b"\x80\x05."
    assert stat.S_IMODE((folder / "call.pkl").stat().st_mode) == 0o600
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".part")]

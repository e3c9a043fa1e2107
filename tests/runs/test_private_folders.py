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

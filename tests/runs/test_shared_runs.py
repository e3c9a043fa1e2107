"""A runs root shared with a team (issue 49): a teammate can write folders beside yours, so
`last` and every lookup by job id consider your folders only, and `last` never picks a folder
whose record is dated in the future or earlier than its own name says; ``plot`` writes its
picture through a file of a new, unguessable name, never through one planted beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.errors import UserError

GOOD = {"name": "mnist", "nodes": 1, "world_size": 1, "launcher": "torchrun"}


def _folder(root: Path, name: str, job_id: str, at: str, owner: int | None = None) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    record = {**GOOD, "job_id": job_id, "submitted_at": at}
    (folder / runs.RECORD).write_text(json.dumps(record))
    if owner is not None:
        for path in (folder / runs.RECORD, folder / "logs", folder):
            os.chown(path, owner, owner)
    return folder


MINE = ("mnist-20261203-100000-aaaaaa", "41", "2026-12-03T10:00:05+00:00")


@pytest.mark.parametrize(
    ("what", "forged"),
    [
        ("a teammate's, later", ("mnist-20261204-100000-bbbbbb", "42",
                                 "2026-12-04T10:00:05+00:00")),
        ("dated 9999", ("mnist-99991231-235959-cccccc", "43", "9999-12-31T23:59:59+00:00")),
        ("its name later than its record", ("mnist-99991231-235959-dddddd", "44",
                                            "2026-12-04T10:00:00+00:00")),
        ("no time zone", ("mnist-20261204-100000-eeeeee", "45", "2026-12-04T10:00:00")),
        ("no time at all", ("mnist-20261204-100000-ffffff", "46", "soon")),
    ],
)  # fmt: skip
def test_last_is_your_newest_plausible_run(
    tmp_path: Path, what: str, forged: tuple[str, str, str]
) -> None:
    _folder(tmp_path, *MINE)
    _folder(tmp_path, *forged, owner=65534 if "teammate" in what else None)
    assert runs.find_run(tmp_path, "last").job_id == "41"


def test_a_job_id_finds_your_folder_only(tmp_path: Path) -> None:
    _folder(tmp_path, *MINE)
    _folder(tmp_path, "mnist-20261204-100000-bbbbbb", "41", "2026-12-04T10:00:05+00:00", 65534)
    _folder(tmp_path, "mnist-20261204-100000-cccccc", "7", "2026-12-04T10:00:05+00:00", 65534)
    assert runs.find_run(tmp_path, "41").path.name == MINE[0]
    with pytest.raises(UserError, match=r"^JOB: no job 7 of yours recorded under "):
        runs.find_run(tmp_path, "7")
    with pytest.raises(UserError, match=r"^JOB: no jobs of yours recorded"):
        runs.find_run(tmp_path / "none", "last")


def test_plot_never_writes_through_a_file_planted_beside_its_picture(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from clustertrain.runs import plot

    folder = _folder(tmp_path, *MINE)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    out = tmp_path / "plot.png"
    (tmp_path / f".plot.png.{os.getpid()}.partial").symlink_to(victim)
    out.symlink_to(victim)
    plot.draw(runs.read_run(folder), out)
    assert victim.read_text() == "untouched"
    assert not out.is_symlink() and out.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in tmp_path.glob(".plot.png.*")] == [f".plot.png.{os.getpid()}.partial"]

"""What comes back from a login node (``stream.fetch``: what ``plot`` draws, a notebook's
value) is unpacked by one checked unpacker (``backends/remote/unpack.py``): plain files and
folders below the run folder, never a link or a device, never this side's records, never
through a planted symlink, bounded in members, names, unpacked bytes and time; anything else
refused in one line with nothing written."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest

from clustertrain.backends.remote import Remote, ssh, stream, unpack
from clustertrain.errors import UserError

REMOTE = Remote("login", "/home/u/.clustertrain/runs/r-1", "clustertrain")


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    """A tar of (name, body, kind) members; kind is tarfile's type byte as text."""
    made = io.BytesIO()
    with tarfile.open(fileobj=made, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, body, kind in members:
            member = tarfile.TarInfo(name)
            member.type, member.size = kind.encode(), len(body)
            if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                member.linkname, member.size = "/etc/passwd", 0
            tar.addfile(member, io.BytesIO(body) if member.size else None)
    return made.getvalue()


def _fetch(monkeypatch: pytest.MonkeyPatch, here: Path, sent: bytes, **kw: int) -> None:
    answer = subprocess.CompletedProcess([], 0, sent, b"")
    monkeypatch.setattr(ssh, "run", lambda *a, **k: answer)
    stream.fetch(REMOTE, here, **kw)  # type: ignore[arg-type]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


REG, DIR = tarfile.REGTYPE.decode(), tarfile.DIRTYPE.decode()
REFUSED: list[tuple[str, list[tuple[str, bytes, str]]]] = [
    ("climbs out", [("./ok.jsonl", b"{}", REG), ("../outside", b"x", REG)]),
    ("absolute", [("/tmp/absolute", b"x", REG)]),
    ("a symlink", [("./events.jsonl", b"", tarfile.SYMTYPE.decode())]),
    ("a hard link", [("./events.jsonl", b"", tarfile.LNKTYPE.decode())]),
    ("a device", [("./dev", b"", tarfile.CHRTYPE.decode())]),
    ("a block device", [("./blk", b"", tarfile.BLKTYPE.decode())]),
    ("a fifo", [("./fifo", b"", tarfile.FIFOTYPE.decode())]),
    ("a sparse file", [("./sparse", b"", tarfile.GNUTYPE_SPARSE.decode())]),
    ("this side's job record", [("./job.json", b"{}", REG)]),
    ("this side's remote record", [("./remote.json", b"{}", REG)]),
    ("a record in a task", [("./tasks/1/job.json", b"{}", REG)]),
    ("a long name", [("./" + "x" * 2000, b"x", REG)]),
    ("a control character", [("./a\x1b]0;x\x07", b"x", REG)]),
    ("a newline", [("./a\nb", b"x", REG)]),
    ("a file and a folder", [("./a", b"x", REG), ("./a/b", b"x", REG)]),
    ("a name twice", [("./a", b"x", REG), ("./a", b"y", REG)]),
    ("an empty name", [("", b"x", REG)]),  # found by the property test
    ("the run folder as a file", [(".", b"x", REG)]),
]


@pytest.mark.parametrize(("what", "members"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_tar_with_anything_but_plain_files_below_the_run_folder_is_refused_whole(
    what: str, members: list[tuple[str, bytes, str]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    here = tmp_path / "run"
    here.mkdir()
    (here / "job.json").write_text("mine")
    with pytest.raises(UserError) as refused:
        _fetch(monkeypatch, here, _tar(("./metrics.jsonl", b"{}\n", REG), *members))
    assert str(refused.value).startswith(f"host: login: {REMOTE.run_dir}: ")
    assert "\n" not in str(refused.value)
    assert _files(tmp_path) == ["run/job.json"] and (here / "job.json").read_text() == "mine"
    assert os.listdir(here) == ["job.json"]  # no staging folder left behind


def test_plain_files_and_folders_land_inside_the_run_folder_as_the_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "run"
    here.mkdir()
    sent = _tar(("./tasks", b"", DIR), ("./metrics.jsonl", b"{}\n", REG),
                ("./tasks/1/events.jsonl", b"{}\n", REG))  # fmt: skip
    _fetch(monkeypatch, here, sent)
    assert _files(tmp_path) == ["run/metrics.jsonl", "run/tasks/1/events.jsonl"]
    assert (here / "metrics.jsonl").stat().st_mode & 0o777 == 0o600
    _fetch(monkeypatch, here, sent)  # fetched again: replaced
    assert (here / "tasks" / "1" / "events.jsonl").read_bytes() == b"{}\n"


def test_a_symlink_planted_in_the_run_folder_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("untouched")
    (here / "tasks").symlink_to(elsewhere)
    (here / "events.jsonl").symlink_to(elsewhere / "victim")
    with pytest.raises(UserError, match="not a folder; nothing was written"):
        _fetch(monkeypatch, here, _tar(("./tasks/1/events.jsonl", b"{}\n", REG)))
    assert _files(elsewhere) == ["victim"]
    _fetch(monkeypatch, here, _tar(("./events.jsonl", b"new\n", REG)))
    assert (elsewhere / "victim").read_text() == "untouched"  # the link replaced, not followed
    assert not (here / "events.jsonl").is_symlink()
    assert (here / "events.jsonl").read_bytes() == b"new\n"


def _bomb(unpacked: int) -> bytes:
    """A gzip of a tar holding one file of ``unpacked`` zero bytes: a few hundred kB."""
    squeeze = zlib.compressobj(9, wbits=31)
    header = tarfile.TarInfo("./events.jsonl")
    header.size = unpacked
    out = [squeeze.compress(header.tobuf())]
    zeros = bytes(1 << 20)
    for _ in range(unpacked >> 20):
        out.append(squeeze.compress(zeros))
    return b"".join([*out, squeeze.flush()])


def test_a_small_gzip_that_unpacks_past_the_limit_is_never_inflated_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "run"
    here.mkdir()
    bomb = _bomb(300 << 20)
    assert len(bomb) < 400_000
    with pytest.raises(UserError, match=r"unpacks to more than 268435456 bytes"):
        _fetch(monkeypatch, here, bomb)
    assert _files(tmp_path) == []
    small = _bomb(1 << 20)
    _fetch(monkeypatch, here, small)  # within the limit: unpacked
    assert (here / "events.jsonl").stat().st_size == 1 << 20


def test_members_time_and_garbage_are_bounded(tmp_path: Path) -> None:
    many = _tar(*[(f"./f{i}", b"", REG) for i in range(6)])
    with pytest.raises(unpack.UnpackError, match="more than 5 members"):
        unpack.unpack(many, tmp_path, unpack.Limits(members=5))
    with pytest.raises(unpack.UnpackError, match="0 s to read"):
        unpack.unpack(many, tmp_path, unpack.Limits(seconds=0))
    for garbage in (b"\x1f\x8bnot gzip", b"BZhnope", b"plain garbage" * 100):
        with pytest.raises(unpack.UnpackError):
            unpack.unpack(garbage, tmp_path)
    assert os.listdir(tmp_path) == []

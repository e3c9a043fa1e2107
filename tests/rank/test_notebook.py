"""The rank side of a notebook's call (clustertrain.rank.notebook), in this process: the call
read only as this user's own file, rank 0's value sealed, each failing rank's error in a line."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from clustertrain import protocol
from clustertrain.files import write_private
from clustertrain.rank import notebook

KEY = b"k" * 32


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder as clustertrain makes one (0700), and a rank's environment in it."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(protocol.ENV_RUN_DIR, str(folder))
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    _as_rank(monkeypatch, 0)
    return folder


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", 2)):
        monkeypatch.setenv(name, str(value))


def _send(run_dir: Path, fn: Any, *args: Any) -> None:
    data = cloudpickle.dumps({"fn": fn, "args": args, "key": KEY})
    write_private(run_dir / protocol.NOTEBOOK_CALL, data)


def _error(run_dir: Path, rank: int) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        (run_dir / protocol.NOTEBOOK_ERROR.format(rank=rank)).read_text()
    )
    return record


def test_a_seal_holds_only_under_its_key_and_for_its_bytes() -> None:
    sealed = notebook.seal(KEY, b"value")
    assert notebook.unseal(KEY, sealed) == b"value"
    assert notebook.unseal(b"x" * 32, sealed) is None
    assert notebook.unseal(KEY, sealed[:-1] + b"w") is None
    assert notebook.unseal(KEY, sealed[: notebook.SEAL_BYTES - 1]) is None
    assert notebook.unseal(KEY, b"value") is None
    assert len(sealed) == len(b"value") + notebook.SEAL_BYTES


def test_rank_0_writes_its_value_sealed_and_private(run_dir: Path) -> None:
    _send(run_dir, divmod, 17, 5)
    assert notebook.main([str(1 << 20)]) == 0
    result = run_dir / protocol.NOTEBOOK_RESULT
    assert result.stat().st_mode & 0o777 == 0o600
    assert cloudpickle.loads(notebook.unseal(KEY, result.read_bytes())) == (3, 2)
    assert notebook.SEAL_BYTES + len(cloudpickle.dumps((3, 2))) == result.stat().st_size


def test_another_rank_calls_the_function_and_writes_nothing(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_rank(monkeypatch, 1)
    marker = run_dir.parent / "called"
    _send(run_dir, Path.touch, marker)
    assert notebook.main([str(1 << 20)]) == 0
    assert marker.exists() and sorted(p.name for p in run_dir.iterdir()) == [protocol.NOTEBOOK_CALL]


def test_a_failing_rank_writes_its_error_in_a_line_and_its_own_traceback(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_rank(monkeypatch, 1)

    def boom(what: str) -> None:
        raise ValueError(f"boom\non {what}")

    _send(run_dir, boom, "rank 1")
    assert notebook.main([str(1 << 20)]) == 1
    record = _error(run_dir, 1)
    assert record["rank"] == 1 and record["node"] == "node7"
    assert record["error"] == "ValueError: boom on rank 1" and isinstance(record["time"], float)
    traceback = capsys.readouterr().err
    # The user's frames only: the runner's own add nothing.
    assert traceback.startswith("Traceback (most recent call last):\n  File ")
    assert traceback.endswith(", in boom\nValueError: boom\non rank 1\n")
    assert "rank/notebook.py" not in traceback and traceback.count("  File ") == 1


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("file", "not a file of this user's alone; not read"),
        ("folder", "not a folder of this user's alone; not read"),
        ("symlink", "cannot be read (Too many levels of symbolic links)"),
    ],
)
def test_a_call_that_others_could_write_is_not_unpickled(
    run_dir: Path, how: str, said: str
) -> None:
    marker = run_dir.parent / "called"
    _send(run_dir, Path.touch, marker)
    call = run_dir / protocol.NOTEBOOK_CALL
    if how == "file":
        call.chmod(0o620)
    elif how == "folder":
        run_dir.chmod(0o770)
    else:
        call.rename(run_dir.parent / "elsewhere")
        call.symlink_to(run_dir.parent / "elsewhere")
    assert notebook.main([str(1 << 20)]) == 1
    assert not marker.exists()
    assert said in _error(run_dir, 0)["error"]


def test_a_call_over_max_bytes_is_not_read(run_dir: Path) -> None:
    _send(run_dir, len, b"x" * 4096)
    assert notebook.main(["1024"]) == 1
    assert _error(run_dir, 0)["error"].endswith("larger than 1024 bytes")


def test_a_value_that_cannot_be_pickled_or_is_too_large_fails_rank_0(run_dir: Path) -> None:
    _send(run_dir, threading.Lock)
    assert notebook.main([str(1 << 20)]) == 1
    said = _error(run_dir, 0)["error"]
    assert said.startswith("the return value (lock) cannot be pickled (TypeError: ")
    assert said.endswith("save it under $CLUSTERTRAIN_OUT_DIR and return its path")

    os.remove(run_dir / protocol.NOTEBOOK_ERROR.format(rank=0))
    _send(run_dir, bytes, 5000)
    assert notebook.main(["4096"]) == 1
    said = _error(run_dir, 0)["error"]
    assert said.startswith("the return value is 50") and "over max_bytes (4096)" in said
    assert not (run_dir / protocol.NOTEBOOK_RESULT).exists()

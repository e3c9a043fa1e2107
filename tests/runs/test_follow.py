"""Following by inotify: what a folder's watch hears is read, and only that, each cycle; what it
cannot hear (a lost event, a symlink, a shared filesystem) is swept, skipped or polled."""

from __future__ import annotations

import errno
import io
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clustertrain import runs
from clustertrain.errors import FieldError
from clustertrain.jobstate import JobState
from clustertrain.render import render
from clustertrain.runs import follow, follow_mode, inotify, logs
from clustertrain.runs.inotify import Watcher
from tests.cli.test_slurm_unreachable import fake_slurm_down
from tests.conftest import job_spec, run_cli

NFS, LUSTRE, EXT4, TMPFS = 0x6969, 0x0BD00BD0, 0xEF53, 0x01021994


@pytest.fixture
def watched() -> Iterator[Watcher]:
    said: list[str] = []
    opened = inotify.Watcher.open(said.append)
    assert opened is not None, said
    yield opened
    opened.close()


def _folder_of(tmp_path: Path, files: int) -> Path:
    """``logs/attempt-0`` with ``files`` node files, each with one line."""
    folder = tmp_path / "logs" / "attempt-0"
    folder.mkdir(parents=True)
    for k in range(files):
        (folder / f"node{k:03d}.out").write_text(f"old {k}\n")
    return folder


class _Cycles:
    """A tail on a fake clock, one cycle a call, counting the ``stat``s each cycle costs."""

    def __init__(self, logs_dir: Path, watcher: Watcher | None, mp: pytest.MonkeyPatch) -> None:
        self.now = [0.0]
        self.tail = follow.Tail(logs_dir, "7", lambda log: True, lambda: self.now[0], None, watcher)
        self.stats = 0
        real = os.stat

        def counted(path: str, *args: object, **kwargs: object) -> os.stat_result:
            self.stats += 1
            return real(path, *args, **kwargs)  # type: ignore[arg-type]

        mp.setattr(follow.os, "stat", counted)

    def __call__(self) -> list[bytes]:
        self.now[0] += follow.CYCLE_S
        self.stats = 0
        return [raw for _, raw in self.tail.poll()]


def test_a_file_appended_to_is_read_and_the_cycle_checks_little_else(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_of(tmp_path, 400)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    assert len(cycle()) == 400 and cycle.stats >= 400  # the first cycle: every file
    assert cycle() == []
    with (folder / "node399.out").open("a") as handle:
        handle.write("new\n")
    assert cycle() == [b"new"]
    # That file, and this cycle's slice of the safety sweep: not the 134 a polling cycle checks.
    assert cycle.stats <= 1 + -(-400 // follow.SAFETY_CYCLES)


def test_the_same_without_inotify_checks_a_third_of_the_files_each_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter of the test above, polling: it does see the cost inotify saves."""
    _folder_of(tmp_path, 400)
    cycle = _Cycles(tmp_path / "logs", None, monkeypatch)
    cycle()
    cycle()
    assert cycle.stats >= 400 // follow.SWEEP_CYCLES


def _append(folder: Path) -> bytes:
    with (folder / "node002.out").open("a") as handle:
        handle.write("unheard\n")
    return b"unheard"


def _make(folder: Path) -> bytes:
    (folder / "node100.out").write_text("made unheard\n")
    return b"made unheard"


@pytest.mark.parametrize("write", [_append, _make], ids=["a-write", "a-new-file"])
def test_the_safety_sweep_reads_what_no_event_told_of(
    tmp_path: Path,
    watched: Watcher,
    monkeypatch: pytest.MonkeyPatch,
    write: Callable[[Path], bytes],
) -> None:
    folder = _folder_of(tmp_path, 3)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    monkeypatch.setattr(watched, "take", lambda folder: set())  # every event lost
    said = write(folder)
    seen = [line for _ in range(follow.SAFETY_CYCLES) for line in cycle()]
    assert seen == [said]


def test_a_new_attempt_folder_and_the_files_made_in_it_later_are_read(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    _folder_of(tmp_path, 1)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    later = tmp_path / "logs" / "attempt-1"
    later.mkdir()
    (later / "node1.err").write_text("made with the folder\n")
    assert cycle() == [b"made with the folder"]
    (later / "node2.out").write_text("made after\n")  # heard by attempt-1's own watch
    (tmp_path / "logs" / "slurm-7.out").write_text("batch\n")
    assert sorted(cycle()) == [b"batch", b"made after"]
    assert cycle.tail.files[str(later / "node2.out")].log.attempt == 1
    assert not any(cycle() for _ in range(3))  # each line once


def test_a_file_grown_past_a_read_chunk_is_read_on_with_no_event_to_say_so(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "READ_CHUNK", 4096)
    folder = _folder_of(tmp_path, 400)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    with (folder / "node399.out").open("a") as handle:
        handle.write("".join(f"line {k:05d}\n" for k in range(4096)))  # 44 KiB: 11 chunks
    seen = [line for _ in range(11) for line in cycle()]
    assert seen == [f"line {k:05d}".encode() for k in range(4096)]


def test_a_folder_moved_away_and_made_again_is_watched_again(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_of(tmp_path, 1)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    folder.rename(tmp_path / "logs" / "old")
    folder.mkdir()
    (folder / "node1.out").write_text("in the new folder\n")
    assert cycle() == [b"in the new folder"]
    (folder / "node2.out").write_text("and after\n")
    assert cycle() == [b"and after"]


def test_a_symlink_is_never_read(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_of(tmp_path, 1)
    secret = tmp_path / "secret"
    secret.write_text("do not show\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "node1.out").write_text("do not show\n")
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    (folder / "node9.out").symlink_to(secret)
    (tmp_path / "logs" / "attempt-1").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "logs" / "slurm-7.err").symlink_to(secret)
    assert cycle() == []
    with secret.open("a") as handle:
        handle.write("still not\n")
    assert [cycle() for _ in range(3)] == [[], [], []] and list(cycle.tail.finish()) == []
    assert str(folder / "node9.out") not in cycle.tail.files


def test_a_queue_that_overflowed_is_a_sweep_of_every_file(
    tmp_path: Path, watched: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past fs.inotify.max_queued_events the kernel drops events and queues IN_Q_OVERFLOW: the
    write whose event was dropped is read in the next cycle all the same."""
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if queued > 1 << 18:
        pytest.skip(f"max_queued_events is {queued}: too many writes to overflow it")
    folder = _folder_of(tmp_path, 200)
    cycle = _Cycles(tmp_path / "logs", watched, monkeypatch)
    cycle()
    a, b = (
        os.open(folder / name, os.O_WRONLY | os.O_APPEND) for name in ("node000.out", "node001.out")
    )
    try:
        for k in range(queued + 10):  # alternating, so that the kernel merges none of them
            os.write(a if k % 2 else b, b"x\n")
    finally:
        os.close(a)
        os.close(b)
    with (folder / "node199.out").open("a") as handle:
        handle.write("after the overflow\n")
    generation = watched.generation
    seen = cycle()
    assert watched.generation > generation
    assert seen.count(b"x") == queued + 10 and b"after the overflow" in seen


def _record(wd: int, mask: int, name: bytes, length: int | None = None) -> bytes:
    padded = name + b"\0" * (-(len(name) + 1) % 16 + 1) if name else b""
    return struct.pack("=iIII", wd, mask, 0, len(padded) if length is None else length) + padded


def test_the_kernels_records_are_parsed_within_what_was_read() -> None:
    first = _record(1, inotify.IN_MODIFY, b"node1.out")
    second = _record(2, inotify.IN_CREATE | inotify.IN_ISDIR, b"attempt-1")
    assert inotify.parse(first + second) == [
        inotify.Event(1, inotify.IN_MODIFY, b"node1.out"),
        inotify.Event(2, inotify.IN_CREATE | inotify.IN_ISDIR, b"attempt-1"),
    ]
    assert inotify.parse(_record(-1, inotify.IN_Q_OVERFLOW, b"")) == [inotify.OVERFLOW]
    # A record cut short, or one that claims more than a name can be: the rest is an overflow.
    assert inotify.parse(first + second[:20]) == [inotify.parse(first)[0], inotify.OVERFLOW]
    assert inotify.parse(first[:10]) == [inotify.OVERFLOW]
    huge = _record(1, inotify.IN_MODIFY, b"x", length=1 << 20) + b"\0" * (1 << 20)
    assert inotify.parse(huge) == [inotify.OVERFLOW]


def test_names_a_folder_does_not_accept_are_dropped(tmp_path: Path, watched: Watcher) -> None:
    folder = _folder_of(tmp_path, 0)
    assert watched.watch(str(folder), follow._NODE_FILE)
    for name in ("node1.out", "notes.txt", "node 2.out", ".out", "node\udcff.out"):
        try:
            (folder / name).write_text("x\n")
        except (UnicodeEncodeError, OSError):
            (folder / os.fsencode(name).decode("latin-1")).write_text("x\n")
    watched.drain()
    assert watched.take(str(folder)) == {"node1.out"}
    assert watched.take(str(folder)) == set() and watched.take(str(tmp_path)) is None


def test_a_watch_is_only_of_a_real_folder(tmp_path: Path, watched: Watcher) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    names = follow._NODE_FILE
    assert watched.watch(str(tmp_path / "real"), names)
    assert not watched.watch(str(tmp_path / "link"), names)
    assert not watched.watch(str(tmp_path / "file"), names)
    assert not watched.watch(str(tmp_path / "missing"), names)
    assert not watched.broken


@pytest.mark.parametrize(
    ("asked", "fs_type", "mode"),
    [
        ("auto", EXT4, "inotify"),
        ("auto", TMPFS, "inotify"),
        ("auto", 0x58465342, "inotify"),  # XFS
        ("auto", NFS, "poll"),
        ("auto", LUSTRE, "poll"),
        ("auto", 0x47504653, "poll"),  # GPFS
        ("auto", 0xFF534D42, "poll"),  # CIFS
        ("auto", 0xFE534D42, "poll"),  # SMB2
        ("auto", 0x00C36400, "poll"),  # CephFS
        ("auto", 0x19830326, "poll"),  # BeeGFS
        ("auto", 0x65735546, "poll"),  # FUSE
        ("auto", 0x12345678, "poll"),  # not known to be local
        ("auto", None, "poll"),  # statfs could not say
        ("poll", EXT4, "poll"),
        ("inotify", NFS, "inotify"),
    ],
)
def test_inotify_only_where_it_hears_every_write(
    asked: str, fs_type: int | None, mode: str
) -> None:
    chosen = follow_mode.choose(asked, fs_type)
    assert chosen.name == mode and chosen.why


def test_the_filesystem_type_is_statfs_f_type(tmp_path: Path) -> None:
    if shutil.which("stat") is None:
        pytest.skip("no coreutils stat to compare with")
    said = subprocess.run(
        ["stat", "-f", "-c", "%t", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert inotify.filesystem_type(tmp_path) == int(said.stdout, 16)
    assert inotify.filesystem_type(tmp_path / "missing") is None


@pytest.mark.parametrize(("value", "asked"), [(None, "auto"), ("", "auto"), ("poll", "poll")])
def test_the_environment_overrides_the_choice(value: str | None, asked: str) -> None:
    environ = {} if value is None else {follow_mode.ENV_FOLLOW: value}
    assert follow_mode.setting(environ) == asked


@pytest.mark.parametrize("value", ["POLL", "inotify ", "yes", "\x1b[2J"])
def test_a_bad_value_names_the_variable(value: str) -> None:
    with pytest.raises(FieldError, match=f"^{follow_mode.ENV_FOLLOW}: invalid value"):
        follow_mode.setting({follow_mode.ENV_FOLLOW: value})


def test_a_bad_value_is_one_line_and_exit_2_from_the_cli(tmp_path: Path) -> None:
    env = fake_slurm_down(tmp_path)
    job = render(job_spec(name="mnist"), str(runs.new_run_dir(tmp_path / "runs", "mnist")), "/w")
    runs.write_run_files(job)
    runs.record_submission(job, "42", "slurm")
    done = run_cli(
        "logs", "42", "--follow", env={**env, follow_mode.ENV_FOLLOW: "fast"}, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and follow_mode.ENV_FOLLOW in done.stderr
    assert "'fast'" in done.stderr and done.stdout == ""


def _run_with_a_line(tmp_path: Path) -> runs.Run:
    job = render(job_spec(name="mnist"), str(runs.new_run_dir(tmp_path, "mnist")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, "5", "slurm")
    (run.logs_dir / "attempt-0").mkdir()
    (run.logs_dir / "attempt-0" / "node1.out").write_text("[rank0]: hello\n")
    return run


def _followed(run: runs.Run, said: list[str]) -> str:
    out = io.StringIO()
    states = iter(["RUNNING", "RUNNING", "COMPLETED"])
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    logs.follow(
        run, logs.Filter(), lambda: JobState("5", next(states)), out, lambda: clock[0], sleep,
        said.append,
    )  # fmt: skip
    return out.getvalue()


def test_no_inotify_to_be_had_is_polling_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spent() -> None:
        raise OSError(errno.EMFILE, "inotify_init1: Too many open files")

    monkeypatch.setenv(follow_mode.ENV_FOLLOW, "inotify")
    monkeypatch.setattr(inotify.Inotify, "__init__", lambda self: spent())
    said: list[str] = []
    assert _followed(_run_with_a_line(tmp_path), said) == "node1 rank0 | hello\n"
    assert len(said) == 1 and "polling" in said[0] and "max_user_instances" in said[0]


def test_a_watch_limit_reached_mid_follow_turns_to_polling_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spent(self: inotify.Inotify, folder: str) -> int:
        raise OSError(errno.ENOSPC, "inotify_add_watch: No space left on device")

    monkeypatch.setenv(follow_mode.ENV_FOLLOW, "inotify")
    monkeypatch.setattr(inotify.Inotify, "add", spent)
    said: list[str] = []
    assert _followed(_run_with_a_line(tmp_path), said) == "node1 rank0 | hello\n"
    assert len(said) == 1 and "polling" in said[0] and "max_user_watches" in said[0]


def test_nothing_is_said_when_inotify_or_polling_serves(tmp_path: Path, follow_env: str) -> None:
    said: list[str] = []
    assert _followed(_run_with_a_line(tmp_path), said) == "node1 rank0 | hello\n"
    assert said == []

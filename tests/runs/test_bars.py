"""Progress bars read as progress (clustertrain.runs.bars): torchrun's tee pieces put back into
each rank's lines, a bar shown once at its last state, drawn in place while following on a
terminal, and never a failure's evidence. tests/fixtures/bars is a real node log (generate.sh)."""

from __future__ import annotations

import io
import re
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustertrain import runs
from clustertrain.jobstate import JobState
from clustertrain.render import render
from clustertrain.runs import bars, logs, why
from clustertrain.runs.bars import Line
from tests.conftest import ROOT, job_spec, run_cli

FIXTURE = Path(__file__).parent.parent / "fixtures" / "bars"
JOB_ID = "7"
# What `clustertrain logs` prints of the fixture: its stdout, then each bar at its last state in
# the order each was done (another bar of that rank began, or its next line), the warning with
# stderr's mark, a bar with none.
SHOWN = [
    "node1 rank0 | rank 0 starts",
    "node1 rank1 | rank 1 starts",
    "node1 rank0 | rank 0 tokenized",
    "node1 rank1 | rank 1 tokenized",
    "node1 rank0 | rank 0 done",
    "node1 rank1 | rank 1 done",
    "node1 rank0 | Running tokenizer on dataset: 100%|██████████| 30/30 "
    "[00:00<00:00, 212.75 examples/s]",
    "node1 rank1 | Running tokenizer on dataset: 100%|██████████| 30/30 "
    "[00:00<00:00, 216.32 examples/s]",
    "node1 rank0 | Epoch 0: 100%|██████████| 6/6 [00:00<00:00, 48.85it/s, loss=1.80]",
    "node1 rank1 | Epoch 0: 100%|██████████| 6/6 [00:00<00:00, 49.13it/s, loss=1.80]",
    "node1 rank1 | eval: 8it [00:00, 98.36it/s]",
    "node1 rank1 ! UserWarning: a warning of the rank's own",
    "node1 rank0 | eval: 8it [00:00, 85.55it/s]",
]


def _run(root: Path, err: bytes | None = None) -> runs.Run:
    """A recorded job whose node1 wrote the fixture's logs (or ``err`` as its stderr)."""
    job = render(job_spec(name="bars", nodes=1), str(runs.new_run_dir(root, "bars")), "/w")
    runs.write_run_files(job)
    run = runs.record_submission(job, JOB_ID, "slurm")
    attempt = run.logs_dir / "attempt-0"
    attempt.mkdir()
    if err is None:
        (attempt / "node1.out").write_bytes((FIXTURE / "node1.out").read_bytes())
        err = (FIXTURE / "node1.err").read_bytes()
    (attempt / "node1.err").write_bytes(err)
    return run


BARS = [
    "Running tokenizer on dataset:  40%|████      | 12/30 [00:00<00:00, 192.76 examples/s]",
    "Map: 100%|██████████| 1000/1000 [00:00<00:00, 12000.00 examples/s]",
    "Epoch 0:  50%|█████     | 1/2 [00:00<00:00,  3.52it/s, v_num=0, train_loss=2.30]",
    "eval: 6it [00:00, 81.92it/s]",
    "  0%|          | 0/6 [00:00<?, ?it/s]",
    "train:  10%|#         | 1/10 [00:03<00:27, 3.01s/it]",
    "big: 12.3k examples [00:02, 5.12k examples/s]",
    "coloured:  40%|\x1b[32m████      \x1b[0m| 4/10 [00:00<00:00, 9.90it/s]",
]
NOT_BARS = [
    "epoch 1 accuracy 50%",
    "ValueError: bad value 50%|####|",
    "Traceback (most recent call last):",
    "[00:00<00:00]",
    "loss 2.3 | lr 0.1 | 50% done",
    "x" * 5000 + " 50%|#####     | 5/10 [00:00<00:00, 9.9it/s]",
    "",
]


@pytest.mark.parametrize("text", BARS)
def test_a_bar_is_known_by_its_shape(text: str) -> None:
    assert bars.is_bar(text)


@pytest.mark.parametrize("text", NOT_BARS)
def test_text_and_error_text_are_not_bars(text: str) -> None:
    assert not bars.is_bar(text)


def _split(lines: list[str]) -> list[tuple[int | None, str]]:
    return [(line.rank, line.text) for line in bars.writers_lines(lines)]


def test_the_tee_pieces_are_put_back_into_each_rank_lines() -> None:
    assert _split(
        [
            "[rank0]: ",
            "[rank0]: a 10%[rank1]: ",
            "[rank1]: b 20%[rank0]: ",  # rank0's line ends with a piece of its own
            "[rank0]: c[rank0]: d",
            "[rank0]:[rank0]: ValueError: boom",  # torch's own prefix on an exception
            "launcher line",
        ]
    ) == [
        (0, ""),
        (1, ""),
        (0, "a 10%"),
        (0, "cd"),
        (0, "ValueError: boom"),
        (None, "launcher line"),
        (1, "b 20%"),  # the end of the file: what a writer left unfinished
    ]
    assert [
        (line.local, line.text) for line in bars.writers_lines(["[default1]:x[default0]:y"])
    ] == [
        (0, "y"),
        (1, "x"),
    ]


def test_a_line_shows_what_a_terminal_would_after_its_carriage_returns() -> None:
    assert _split(["[rank0]: \r 10%\r 20%\r 30%\r"]) == [(0, " 30%")]
    assert _split(["[rank0]: \r 10%[rank0]: \r 20%"]) == [(0, " 20%")]
    assert _split(["[rank0]: done\r      \r"]) == [(0, "done")]
    assert bars.overwritten("plain") == "plain"


def _collapse(texts: list[tuple[int, str]]) -> list[tuple[int | None, str]]:
    collapser = bars.Collapser()
    shown = [line for r, t in texts for line in collapser.feed(Line(r, None, t))[0]]
    return [(line.rank, line.text) for line in shown + collapser.finish()]


def test_a_bar_shows_once_at_its_last_state_per_rank() -> None:
    a10, a50, a100 = (f"a: {p:3d}%|#   | {p}/100 [00:00<00:00, 9.9it/s]" for p in (10, 50, 100))
    b0 = "b:   0%|    | 0/100 [00:00<?, ?it/s]"
    again = "a:   0%|    | 0/100 [00:00<?, ?it/s]"
    shown = _collapse([(0, ""), (0, a10), (1, a10), (0, a50), (0, a100), (0, b0), (1, "hi")])
    assert shown == [(0, a100), (1, a10), (1, "hi"), (0, b0)]
    # The same bar again (the next epoch's) ends the one before it.
    assert _collapse([(0, a50), (0, again)]) == [(0, a50), (0, again)]
    # Blank lines the script wrote are kept; those beside a bar are the tee's.
    assert _collapse([(0, "x"), (0, ""), (0, "y"), (0, ""), (0, a10), (0, "")]) == [
        (0, "x"),
        (0, ""),
        (0, "y"),
        (0, a10),
    ]
    raw = bars.Collapser(hold=False)
    assert raw.feed(Line(0, None, a10)) == ([Line(0, None, a10)], None)


def test_logs_prints_the_fixture_bars_once_each_without_a_prefix_inside(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs")
    shown = list(logs.read_all(run, logs.Filter()))
    assert shown == SHOWN
    assert list(logs.read_all(run, logs.Filter(errors=True))) == [SHOWN[-2]]
    raw = list(logs.read_all(run, logs.Filter(raw=True)))
    assert len(raw) > 60 and not any("[rank" in line for line in raw)
    # As users run it: the worktree's clustertrain, as a subprocess.
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    printed = run_cli("logs", JOB_ID, env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == SHOWN


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


def _follow(run: runs.Run, out: io.StringIO, pieces: list[bytes]) -> None:
    """Follow ``run`` while its node1.err is written in ``pieces``, a piece a cycle."""
    log = run.logs_dir / "attempt-0" / "node1.err"
    log.write_bytes(b"")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if pieces:
            with log.open("ab") as handle:
                handle.write(pieces.pop(0))

    def state() -> JobState:
        return JobState(JOB_ID, "RUNNING" if pieces else "COMPLETED")

    final = logs.follow(run, logs.Filter(), state, out, clock=lambda: now[0], sleep=sleep)
    assert final.state == "COMPLETED"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


_ERASE = re.compile(r"\x1b\[(\d+)F\x1b\[J")


def _screen(written: str) -> tuple[list[str], list[list[str]]]:
    """What a terminal shows after ``written`` (the board's erases carried out), and each board
    drawn on it."""
    screen: list[str] = []
    boards: list[list[str]] = []
    at = 0
    for erase in _ERASE.finditer(written):
        screen += written[at : erase.start()].splitlines()
        count = int(erase[1])
        boards.append(screen[-count:])
        del screen[-count:]
        at = erase.end()
    return screen + written[at:].splitlines(), boards


def test_following_on_a_terminal_draws_a_live_line_per_rank_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("TERM", raising=False)
    run = _run(tmp_path)
    out = _Terminal()
    _follow(run, out, _pieces((FIXTURE / "node1.err").read_bytes(), 300))
    screen, boards = _screen(out.getvalue())
    assert screen == SHOWN  # every bar erased once done, its last state kept
    assert boards and all(len(board) <= 2 for board in boards)  # a line per rank, at most
    moving = [line for board in boards for line in board]
    assert any(re.search(r"rank[01] \| Running tokenizer on dataset:  \d\d%", m) for m in moving)
    assert all(line.startswith(("node1 rank0 | ", "node1 rank1 | ")) for line in moving)


def test_following_elsewhere_prints_each_bar_once_as_reading_does(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = io.StringIO()
    _follow(run, out, _pieces((FIXTURE / "node1.err").read_bytes(), 123))
    assert out.getvalue().splitlines() == SHOWN
    assert "\x1b" not in out.getvalue()


def test_a_dumb_terminal_gets_no_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    out = _Terminal()
    _follow(_run(tmp_path), out, _pieces((FIXTURE / "node1.err").read_bytes(), 500))
    assert out.getvalue().splitlines() == SHOWN


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=4600), max_size=8))
def test_following_the_fixture_cut_anywhere_prints_what_reading_it_after(cuts: list[int]) -> None:
    data = (FIXTURE / "node1.err").read_bytes()
    bounds = sorted({min(cut, len(data)) for cut in cuts} | {len(data)})
    with tempfile.TemporaryDirectory() as tmp:
        out = io.StringIO()
        _follow(
            _run(Path(tmp)), out, [data[a:b] for a, b in zip([0, *bounds], bounds, strict=False)]
        )
        assert out.getvalue().splitlines() == SHOWN


def test_a_board_of_many_ranks_draws_a_line_per_description_cut_to_the_width() -> None:
    out = _Terminal()
    board = bars.Board(out, live=True, columns=lambda: 40)
    for rank in range(12):
        text = f"Epoch 0: {rank * 5:3d}%|#   | {rank}/20 [00:00<00:00, 9.9it/s]"
        board.update(f"node1 rank{rank}", f"node1 rank{rank} | {text}", text)
    board.draw()
    assert out.getvalue() == "12 bars, the least along: node1 rank0 |\n"  # 39 columns
    board.update("node1 rank3", None)
    board.print("node1 rank3 | done")
    board.draw()
    board.close()
    assert _screen(out.getvalue())[0] == ["node1 rank3 | done"]


def test_hostile_bars_are_bounded_escaped_and_no_traceback(tmp_path: Path) -> None:
    segment = b"\rMap:  50%|#####     | 5/10 [00:00<00:00, 9.90 examples/s]"
    endless = b"[rank0]: " + segment * ((10 << 20) // len(segment))  # 10 MB, no newline
    hostile = (
        b"[rank1]: \x1b[32mMap\xff:  40%|\x1b]0;owned\x07####      | 4/10 [00:00<00:00, 9.9it/s]\n"
        b"[rank1]: \xc3\x28 not a bar\n"
    )
    run = _run(tmp_path, hostile + endless)
    tracemalloc.start()
    shown = list(logs.read_all(run, logs.Filter()))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 << 20, peak  # a few pieces of a megabyte, never the 10 MB
    assert all(line.isprintable() and len(line) < 300 for line in shown), shown
    assert shown[0] == (
        "node1 rank1 | \\x1b[32mMap\ufffd:  40%|\\x1b]0;owned\\x07####      | 4/10 "
        "[00:00<00:00, 9.9it/s]"
    )
    assert shown[1] == "node1 rank1 ! \ufffd( not a bar"
    assert shown[2:] and all(
        line.endswith("5/10 [00:00<00:00, 9.90 examples/s]") for line in shown[2:]
    )
    assert len(shown) == 3  # what the carriage returns overwrote is dropped as it is read
    # Followed while written in pieces of 3 MB, it reads the same.
    tracemalloc.start()
    out = io.StringIO()
    _follow(run, out, _pieces(hostile + endless, 3 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 << 20, peak
    assert out.getvalue().splitlines() == shown


def test_a_bar_is_never_a_failure_evidence(tmp_path: Path) -> None:
    only_bars = b"".join(
        f"[rank{rank}]: {desc}:  50%|#####     | 5/10 [00:00<00:00, 9.9it/s]\n".encode()
        for rank, desc in (
            (0, "Filtering samples with CUDA out of memory"),
            (1, "NCCL error sweep"),
        )
    )
    run = _run(tmp_path, only_bars)
    records = why.read(run, JobState(JOB_ID, "FAILED"))
    assert not any(tail.lines for tail in records.tails)
    found = why.cause(records)
    assert found is not None and found.kind is why.Kind.UNKNOWN, found
    # Beside a rank's own error, the bars after it change nothing.
    run = _run(tmp_path / "again", b"[rank1]: ValueError: boom\n" + only_bars)
    found = why.cause(why.read(run, JobState(JOB_ID, "FAILED")))
    assert found is not None and found.kind is why.Kind.EXCEPTION and found.rank == 1
    assert found.decisive == "ValueError: boom"
    assert not any(bars.is_bar(line) for line in found.evidence)

"""Stacks read and grouped (clustertrain.node.frames): the watchdog's hang line and
`clustertrain stacks` place ranks through the same functions."""

from __future__ import annotations

from clustertrain.node import frames

LIB = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _faulthandler(*frames_: tuple[str, str, int]) -> str:
    lines = ["Thread 0x00007f94e8677b80 (most recent call first):",
             '  File "/usr/lib/python3.11/threading.py", line 327 in wait', "",
             "Current thread 0x00007f163a442b80 (most recent call first):"]  # fmt: skip
    lines += [f'  File "{file}", line {line} in {func}' for func, file, line in frames_]
    return "\n".join(lines) + "\n"


WAITING = _faulthandler(
    ("all_reduce", LIB, 2501),
    ("step", "/home/me/train.py", 88),
    ("<module>", "/home/me/train.py", 99),
)
SLEEPING = _faulthandler(("<module>", "/home/me/train.py", 21))


def test_ranks_in_the_same_frames_are_one_group_and_the_odd_one_comes_first() -> None:
    found = frames.group({0: WAITING, 1: SLEEPING, 2: WAITING, 4: WAITING, 5: WAITING})
    assert [g.head() for g in found] == [
        "rank 1 (1): <module> (train.py:21)",
        "ranks 0, 2, 4-5 (4): all_reduce (train.py:88)",
    ]
    # outermost first, the user's own frames marked
    assert found[1].lines()[1:] == [
        "  > <module>  /home/me/train.py:99",
        "  > step  /home/me/train.py:88",
        f"    all_reduce  {LIB}:2501",
    ]
    assert found[1].as_dict()["frames"][0] == {
        "func": "all_reduce", "file": LIB, "line": 2501, "user": False
    }  # fmt: skip


def test_a_rank_without_a_stack_is_grouped_last_and_says_so() -> None:
    found = frames.group({0: WAITING, 1: "no stack: py-spy is not installed on this node\n"})
    assert [g.head() for g in found][-1] == "rank 1 (1): no stack (it did not answer)"
    assert frames.taken_by(WAITING) == "faulthandler" and frames.taken_by("") == "none"


def test_py_spys_stacks_are_read_the_same_way() -> None:
    stack = (
        "Process 27300: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 27300 (idle): "MainThread"\n'
        f"    all_reduce ({LIB}:2501)\n    step (/home/me/train.py:88)\n"
        "    <module> (/home/me/train.py:99)\n"
    )
    assert frames.where(stack) == "all_reduce (train.py:88)"
    assert frames.taken_by(stack) == "py-spy"
    # the same frames from either tool are the same group
    assert len(frames.group({0: stack, 1: WAITING})) == 1

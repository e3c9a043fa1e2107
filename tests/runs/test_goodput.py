"""Goodput and its badput buckets from a job's events (clustertrain.runs.goodput): every second
from the first start to the last end in one bucket, and forged values bending a bucket, never
the total."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from clustertrain.rank.events import Event
from clustertrain.runs.goodput import BUCKETS, goodput

T0 = 1_000_000_000.0


Rows = Sequence[tuple[float, str, int, Mapping[str, Any]]]


def made(rows: Rows) -> list[Event]:
    return [Event(T0 + at, name, attempt, dict(values)) for at, name, attempt, values in rows]


# A job whose step hung once (restarted inside the allocation from its checkpoint) and that
# was then requeued once: the supervisor's, the watchdog's and the script's events.
HUNG_THEN_REQUEUED: Rows = [
    (0.0, "queued", 0, {}),
    (2.0, "started", 0, {"nodes": "node[1-2]"}),
    (3.0, "node_check", 0, {}),
    (6.0, "rendezvous", 0, {"seconds": 3.0}),
    (7.0, "data_ready", 0, {"seconds": 4.0}),
    (9.0, "step", 0, {"epoch": 1, "step": 10}),
    (11.0, "checkpoint", 0, {"epoch": 1, "seconds": 0.5}),
    (14.0, "hang", 0, {"step": 12, "seconds": 2.0}),  # quiet since 12
    (15.0, "restarted", 0, {"why": "hang"}),
    (17.0, "data_ready", 0, {}),
    (18.0, "step", 0, {"step": 11}),
    (20.0, "checkpoint", 0, {"seconds": 0.25}),
    (21.0, "stop", 0, {}),
    (22.0, "requeued", 0, {}),
    (30.0, "started", 1, {}),
    (31.0, "node_check", 1, {}),
    (31.5, "qualified", 1, {"nodes": "node1 node2", "why": "0 flagged"}),
    (33.0, "data_ready", 1, {}),
    (34.0, "step", 1, {"step": 20}),
    (40.0, "checkpoint", 1, {"seconds": 1.0}),
    (41.0, "ended", 1, {"status": "0"}),
]


def test_every_second_of_a_hung_then_requeued_job_is_in_one_bucket() -> None:
    found = goodput(made(HUNG_THEN_REQUEUED))
    assert (found.attempts, found.restarts, found.queue_wait_s) == (2, 1, 2.0)
    assert (found.wall_s, found.allocated_s) == (39.0, 31.0)
    assert dict(found.badput) == {
        "node check": 1.0 + 1.5,  # to node_check, then to qualified
        "start-up": 4.0 + 1.5,
        "checkpoint restore": 1.0 + 1.0,  # data ready to first step, in each resumed run
        "checkpoint save": 0.5 + 0.25 + 1.0,
        "restarts": 3.0 + 2.0,  # fault (12) to the restart (15), then to data ready (17)
        "lost progress": 1.0,  # the checkpoint (11) to the fault (12)
        "requeue wait": 8.0,
    }
    # Training: 7-11 less its save, 17-22 less save and restore, 33-41 less save and restore.
    assert found.productive_s == pytest.approx(3.5 + 3.75 + 6.0)
    assert found.productive_s + sum(s for _, s in found.badput) == pytest.approx(39.0)
    assert [name for name, _ in found.badput] == list(BUCKETS)


def test_a_clean_job_is_start_up_then_training() -> None:
    rows: Rows = [
        (0.0, "queued", 0, {}),
        (5.0, "started", 0, {}),
        (6.0, "node_check", 0, {}),
        (8.0, "step", 0, {"step": 1}),
        (20.0, "ended", 0, {"status": "0"}),
    ]
    found = goodput(made(rows))
    assert (found.productive_s, found.wall_s, found.queue_wait_s) == (12.0, 15.0, 5.0)
    assert found.bucket("node check") == 1.0 and found.bucket("start-up") == 2.0
    assert found.bucket("checkpoint restore") == 0.0  # nothing to restore from


def test_a_killed_attempt_loses_what_followed_its_last_checkpoint() -> None:
    rows: Rows = [
        (0.0, "started", 0, {}),
        (1.0, "step", 0, {}),
        (4.0, "checkpoint", 0, {"seconds": 1.0}),
        (9.0, "step", 0, {}),
    ]
    found = goodput(made(rows))
    assert found.bucket("lost progress") == 5.0
    assert found.productive_s == 2.0  # 1-4 less the save


@pytest.mark.parametrize(
    "forged",
    [
        {"seconds": 1e300},
        {"seconds": -50.0},
        {"seconds": 9.9e18},
    ],
)
def test_forged_seconds_bend_a_bucket_never_the_total(forged: dict[str, object]) -> None:
    rows: Rows = [
        (0.0, "started", 0, {}),
        (1.0, "data_ready", 0, {}),
        (2.0, "step", 0, {}),
        (5.0, "checkpoint", 0, forged),
        (6.0, "hang", 0, forged),
        (7.0, "restarted", 0, {"why": "hang"}),
        (8.0, "step", 0, {}),
        (10.0, "ended", 0, {"status": "0"}),
    ]
    found = goodput(made(rows))
    spent = dict(found.badput)
    assert all(0.0 <= s <= 10.0 for s in spent.values()), spent
    assert 0.0 <= found.productive_s <= 10.0
    assert found.productive_s + sum(spent.values()) == pytest.approx(10.0)


def test_attempts_whose_numbers_lie_about_their_order_give_no_negative_time() -> None:
    rows: Rows = [
        (0.0, "started", 1, {}),
        (1.0, "step", 1, {}),
        (2.0, "started", 0, {}),
        (3.0, "step", 0, {}),
        (4.0, "ended", 0, {"status": "0"}),
        (9.0, "ended", 1, {"status": "0"}),
    ]
    found = goodput(made(rows))
    assert all(s >= 0.0 for _, s in found.badput)
    assert found.wall_s == 9.0 and found.queue_wait_s is None


def test_no_events_is_no_attempt_and_no_span() -> None:
    found = goodput([])
    assert (found.attempts, found.wall_s, found.productive_s) == (0, None, 0.0)
    assert all(s == 0.0 for _, s in found.badput)

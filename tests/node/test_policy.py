"""The policy's decisions on restart storms and on a rank's request not to be restarted, pure:
outcomes in, decisions out (clustertrain.node.policy)."""

from __future__ import annotations

from clustertrain import protocol
from clustertrain.node import policy
from clustertrain.node.policy import End, Exit, Outcome, Policy, Restart, State, decide

AT = "step 40 of epoch 2"


def failed(saved: bool | None, status: int = 1, hang: str | None = None) -> Outcome:
    return Outcome(status, hang=hang, saved=saved, checkpoint=AT if saved is not None else "")


def test_restarts_that_never_get_past_the_checkpoint_end_in_a_restart_storm() -> None:
    state, rules = State(), Policy(max_restarts=10, storm_restarts=3)
    # The first run checkpointed, then failed: a restart, and nothing stalled yet.
    assert isinstance(decide(failed(saved=True), state, rules, "/o"), Restart)
    said = [decide(failed(saved=False), state, rules, "/o") for _ in range(3)]
    assert [type(d) for d in said] == [Restart, Restart, End]
    end = said[-1]
    assert isinstance(end, End) and end.status == Exit.RESTART_STORM == 7
    assert end.message is not None and end.message.startswith(
        f"restart storm: 3 restarts never got past {AT} (the last checkpoint); stopped restarting"
    )
    assert end.event == ("restart_storm", {"why": AT, "restarts": 3})
    assert state.step_restarts == 3


def test_a_restart_that_checkpoints_starts_the_count_again() -> None:
    state, rules = State(), Policy(max_restarts=10, storm_restarts=2)
    runs = [True, False, True, False, False]
    said = [decide(failed(saved=s), state, rules, "/o") for s in runs]
    assert [type(d) for d in said] == [Restart, Restart, Restart, Restart, End]


def test_a_hang_counts_and_the_storm_is_named_where_the_restarts_run_out_too() -> None:
    state, rules = State(), Policy(max_restarts=2, storm_restarts=2)
    said = [decide(failed(False, 143, hang="hang at step 9"), state, rules, "/o") for _ in range(3)]
    assert [type(d) for d in said] == [Restart, Restart, End]
    assert said[-1] == End(
        Exit.RESTART_STORM, said[-1].message, ("restart_storm", {"why": AT, "restarts": 2})
    )


def test_before_any_checkpoint_or_without_storm_restarts_only_max_restarts_bounds_them() -> None:
    for saved, storm in ((None, 3), (False, 0)):
        state, rules = State(), Policy(max_restarts=4, storm_restarts=storm)
        said = [decide(failed(saved), state, rules, "/o") for _ in range(5)]
        assert [type(d) for d in said] == [Restart] * 4 + [End]
        assert said[-1] == End(1)


def test_a_run_that_succeeds_or_asks_for_a_requeue_is_no_storm() -> None:
    state, rules = State(step_restarts=1, stalled=5), Policy(max_restarts=9, storm_restarts=3)
    assert decide(Outcome(0, saved=False), state, rules, "/o") == End(0)
    asked = decide(Outcome(1, saved=False, requeue_asked=True), state, rules, "/o")
    assert isinstance(asked, policy.Requeue)


def test_a_rank_that_asks_not_to_be_restarted_ends_the_job_at_once() -> None:
    state, rules = State(active=["a", "b"], spares=["c"]), Policy(max_restarts=5)
    asked = Outcome(1, no_restart=(3, "node2"), requeue_asked=True, lost=("a",), saved=False)
    end = decide(asked, state, rules, "/o")
    assert end == End(
        Exit.NO_RESTART,
        f"rank 3 on node2 asked not to be restarted (exit {protocol.NO_RESTART_EXIT}): the job "
        "ends here, without a restart or a requeue",
        ("no_restart", {"nodes": "node2", "rank": 3}),
    )
    assert Exit.NO_RESTART == protocol.NO_RESTART_EXIT == 79
    assert state == State(active=["a", "b"], spares=["c"])  # nothing replaced, nothing counted


def test_a_checkpoint_that_says_no_step_is_the_last_checkpoint() -> None:
    state, rules = State(step_restarts=1), Policy(max_restarts=5, storm_restarts=1)
    end = decide(Outcome(1, saved=False), state, rules, "/o")
    assert isinstance(end, End) and end.message is not None
    assert end.message.startswith("restart storm: 1 restart never got past the last checkpoint;")

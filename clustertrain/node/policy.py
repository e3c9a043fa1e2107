"""What a job does when its step ends: the fault-tolerance policy, as pure decisions.

The supervisor (:mod:`clustertrain.node.supervisor`) runs a step, reads what it left
(:class:`Outcome`: its exit status, the watchdog's hang report, the nodes its roll call lost, a
rank's requeue request) and asks :func:`decide` what comes next: a :class:`Restart` of the step
on the same nodes, a :class:`Replace` of lost nodes by spares, a :class:`Requeue` through
Slurm, or the :class:`End` with a named exit status. No I/O here: each branch is a unit test
(tests/node/test_supervisor.py), as submitit keeps its requeue policy in
``SignalHandler.checkpoint_and_try_requeue``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from clustertrain import protocol
from clustertrain.node.rollcall import replace
from clustertrain.rank import events


class Exit(IntEnum):
    """The job's own exit statuses; any other is the step's (the failed rank's)."""

    UNKNOWN_TASK = 2  # an array task that is none of the sweep's
    REQUEUE_LIMIT = 3  # a rank asked for a requeue, and max_requeues were spent
    HUNG = 4  # the step hung (the watchdog ended it) and no restart was left
    NODE_LOST = 5  # a node was lost and neither a spare nor a requeue was left
    DISQUALIFIED = 6  # qualification flagged a node, no spare was left and on_flagged is fail
    RESTART_STORM = 7  # storm_restarts restarts in a row never got past the last checkpoint
    NO_RESTART = protocol.NO_RESTART_EXIT  # a rank asked not to be restarted, with this status


@dataclass(frozen=True)
class Policy:
    """The job's fault-tolerance fields, as its plan gives them."""

    max_restarts: int = 0
    max_requeues: int = 3
    requeue_on_node_failure: bool = False
    storm_restarts: int = 3  # 0: restarts are bounded by max_restarts alone


@dataclass
class State:
    """Where the job stands: its attempt (Slurm's restart count), the restarts of its step in
    this allocation, and with spare nodes the nodes it trains on and those it holds."""

    attempt: int = 0
    step_restarts: int = 0
    node_restarts: int = 0
    stalled: int = 0  # restarted runs in a row that ended without a new checkpoint
    active: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """What one run of the step left."""

    status: int
    hang: str | None = None  # the watchdog's report, when it declared the step hung
    lost: tuple[str, ...] = ()  # the nodes its roll call did not hear from
    spares_lost: tuple[str, ...] = ()  # spares that did not answer theirs, asked afterwards
    requeue_asked: bool = False  # a rank checkpointed and asked (runtime.request_requeue)
    # Whether the run recorded a checkpoint (rank 0's ``checkpoint`` event); None while the job
    # has recorded none at all: before its first checkpoint, or a script that records none,
    # progress is not judged (nvidia-resiliency-ext's progress tracker waits for its marker so).
    saved: bool | None = None
    checkpoint: str = ""  # where the last checkpoint stands: "step 41 of epoch 3"
    no_restart: tuple[int, str] | None = None  # the rank (and node) that exited NO_RESTART_EXIT


@dataclass(frozen=True)
class Restart:
    """The step again on the same nodes, from the last checkpoint; ``keep`` names the folder
    its heartbeats and stacks are kept in (``heartbeats-hung-1``)."""

    why: str  # "hang" or "crash": the restarted event's
    keep: str
    message: str


@dataclass(frozen=True)
class Replace:
    """The step again on ``nodes`` (the kept ones, then spares), holding ``spares``."""

    nodes: list[str]
    spares: list[str]
    message: str


@dataclass(frozen=True)
class Requeue:
    """Through Slurm's queue: ``scontrol requeue``, after setting the job requeueable when it
    was submitted not so (``--no-requeue``: a lost node would otherwise requeue it)."""

    why: str | None
    make_requeueable: bool
    message: str


@dataclass(frozen=True)
class End:
    status: int
    message: str | None = None  # said on stderr
    # The event that says why, where the end is the policy's own: its name and values.
    event: tuple[str, dict[str, str | int]] | None = None


Decision = Restart | Replace | Requeue | End


@dataclass(frozen=True)
class Train:
    """Train on ``nodes`` (with spare nodes: the step's nodelist), holding ``spares``."""

    nodes: list[str]
    spares: list[str]
    message: str | None = None  # said on stdout


def qualified(flagged: dict[str, str], state: State, on_flagged: str) -> Train | End:
    """Before training: flagged nodes (node: why) are swapped for qualified spares; with too
    few spares left, ``on_flagged`` decides: ``fail`` ends the job naming them, ``warn``
    trains on them and says so. Without spare nodes, ``state.active`` is empty: the step runs
    on the whole allocation."""
    said = "; ".join(f"{node}: {why}" for node, why in flagged.items())
    if not flagged:
        return Train(state.active, state.spares)
    try:
        if not state.active:  # no spare nodes: the step runs on every node, flagged ones too
            raise LookupError("no spare")
        nodes, spares = replace(state.active, state.spares, list(flagged))
    except LookupError:
        if on_flagged == "fail":
            return End(
                Exit.DISQUALIFIED,
                f"qualification flagged {said}; no qualified spare is left to replace it, so the "
                "job ends before training (on_flagged: warn trains on it; spare_nodes: 1 "
                "replaces it)",
            )
        spares = [node for node in state.spares if node not in flagged]
        return Train(state.active, spares, f"qualification flagged {said}; training on it "
                     "anyway (on_flagged: warn)")  # fmt: skip
    state.active, state.spares = nodes, spares
    swapped = [node for node in flagged if node not in nodes]
    return Train(nodes, spares, f"qualification flagged {said}; training on {','.join(nodes)} "
                 f"instead ({','.join(swapped) or 'no node'} left out)")  # fmt: skip


def decide(outcome: Outcome, state: State, policy: Policy, out_dir: str) -> Decision:
    """The next move after a step ended with ``outcome``. ``state`` is updated for a restart or a
    replacement (the caller runs the step again); ``out_dir`` is named where a job ends with
    its checkpoints."""
    if outcome.no_restart is not None:
        rank, node = outcome.no_restart
        return End(
            Exit.NO_RESTART,
            f"rank {rank} on {node} asked not to be restarted (exit {Exit.NO_RESTART}): the job "
            "ends here, without a restart or a requeue",
            (events.NO_RESTART, {"nodes": node, "rank": rank}),
        )
    if outcome.lost and not outcome.requeue_asked:
        return _lost(outcome, state, policy, out_dir)
    if (storm := _storm(outcome, state, policy, out_dir)) is not None:
        return storm
    if not outcome.requeue_asked and state.step_restarts < policy.max_restarts:
        restart = _restart(outcome, state, policy)
        if restart is not None:
            return restart
    if outcome.requeue_asked:
        if state.attempt < policy.max_requeues:
            return Requeue(
                None,
                make_requeueable=not policy.requeue_on_node_failure,
                message=f"checkpoint taken; requeueing (restart {state.attempt + 1} of at most "
                f"{policy.max_requeues})",
            )
        return End(
            Exit.REQUEUE_LIMIT,
            f"requeue limit of {policy.max_requeues} reached: the job ends here; its last "
            f"checkpoint is in {out_dir}/checkpoints",
        )
    if outcome.hang is not None:
        return End(Exit.HUNG, f"the step hung and was ended: {outcome.hang}")
    return End(outcome.status)


def _storm(outcome: Outcome, state: State, policy: Policy, out_dir: str) -> End | None:
    """A restart storm: ``storm_restarts`` restarted runs in a row failed without recording a
    checkpoint, so each began again where the one before did: the fault repeats from that
    checkpoint, and another restart would spend the allocation the same way."""
    failed = outcome.hang is not None or outcome.status != 0
    if outcome.requeue_asked or not failed or outcome.saved is None:
        return None
    if outcome.saved:
        state.stalled = 0
    elif state.step_restarts + state.node_restarts > 0:  # this run was itself a restart
        state.stalled += 1
    if not policy.storm_restarts or state.stalled < policy.storm_restarts:
        return None
    at = (
        f"{outcome.checkpoint} (the last checkpoint)"
        if outcome.checkpoint
        else "the last checkpoint"
    )
    return End(
        Exit.RESTART_STORM,
        f"restart storm: {state.stalled} restart{'s' * (state.stalled != 1)} never got past "
        f"{at}; stopped restarting: the fault repeats from that checkpoint, in "
        f"{out_dir}/checkpoints",
        (events.RESTART_STORM, {"why": outcome.checkpoint, "restarts": state.stalled}),
    )


def _restart(outcome: Outcome, state: State, policy: Policy) -> Restart | None:
    """A hung or failed step starts again on the same nodes, without a trip through the queue."""
    number = f"restart {state.step_restarts + 1} of at most {policy.max_restarts}"
    if outcome.hang is not None:
        why, keep = "hang", "hung"
        said = f"the step hung: {outcome.hang}; starting it again on the same nodes ({number})"
    elif outcome.status != 0:
        why, keep = "crash", "failed"
        said = (
            f"the step failed (exit status {outcome.status}); starting it again on the same "
            f"nodes ({number})"
        )
    else:
        return None
    state.step_restarts += 1
    return Restart(why, f"{keep}-{state.step_restarts}", said)


def _lost(outcome: Outcome, state: State, policy: Policy, out_dir: str) -> Decision:
    """Nodes the roll call lost: a spare replaces each, else a requeue without them (when the
    job asks for one), else the end."""
    gone = ",".join(outcome.lost)
    try:
        nodes, spares = replace(state.active, state.spares, [*outcome.lost, *outcome.spares_lost])
    except LookupError:
        if policy.requeue_on_node_failure and state.attempt < policy.max_requeues:
            return Requeue(
                events.NODE_LOST,
                make_requeueable=False,
                message=f"lost {gone} and no spare node is left: requeueing",
            )
        return End(
            Exit.NODE_LOST,
            f"lost {gone} and no spare node is left: the job ends here; its last checkpoint "
            f"is in {out_dir}/checkpoints",
        )
    state.node_restarts += 1
    state.active, state.spares = nodes, spares
    left = ",".join(spares) or "none"
    return Replace(
        nodes,
        spares,
        f"lost {gone}; starting the step again on {','.join(nodes)} from the last checkpoint "
        f"(spares left: {left})",
    )

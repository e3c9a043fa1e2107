"""What the rendered batch script and the ranks agree on, written down once.

The renderer hands these values to the templates, the rank side (:mod:`clustertrain.rank.runtime`,
:mod:`clustertrain.rank.env`) reads the same names, and the log reader parses the same prefix. No
other module spells them out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A metric's name, as a job names its headline (``metric``) and a script logs it
# (runtime.log_metrics, events.record): "test_acc", "val/loss", "top-1". The event reader keeps
# only values whose names match, so a run folder's events cannot smuggle in anything else.
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
# A Slurm node's name as clustertrain accepts it wherever one reaches a command line or a record
# (exclude, the node record, a qualification's figures): one plain name, never a range
# (node[1-4]), an option (-x) or anything a shell or sbatch would read twice.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Which way a headline metric is better (``metric_mode``): accuracy "max", a loss "min".
METRIC_MODES = ("max", "min")

# The rendezvous port is derived from the job id so that two jobs sharing a node never share a
# c10d store (seen here: two jobs on port 29500 joined one rendezvous and one of them failed).
PORT_BASE, PORT_SPAN = 29500, 20000

# Slurm warns the batch shell with this signal before the time limit (--signal=B:USR2@lead);
# USR1 is left to NCCL. The batch shell passes it on to every rank.
STOP_SIGNAL = "USR2"

# The run folder's layout. clustertrain.runs writes and reads it; the batch script (given these
# as values), the local supervisor and the ranks use the same names.
SPEC_FILE = "spec.yaml"
RECORD_FILE = "job.json"
PLAN_FILE = "plan.json"  # what the supervisor runs and decides (clustertrain.node.plan)
# A run submitted with --host: where it is (clustertrain.backends.remote), beside its job.json.
REMOTE_FILE = "remote.json"
PREPARE_LOG = "prepare.log"  # the prepare step's output (clustertrain.pipeline.prepare)
LOGS_DIR = "logs"  # slurm-<id>.{out,err} of the batch shell, ATTEMPT_DIR/<node>.{out,err}
ATTEMPT_DIR = "attempt-"  # + the attempt's number (SLURM_RESTART_COUNT), under LOGS_DIR
OUT_DIR = "out"  # what the ranks write: ENV_OUT_DIR points here
METRICS_FILE = "metrics.jsonl"  # under OUT_DIR: one record per epoch, then "done"
CHECKPOINTS_DIR = "checkpoints"  # under OUT_DIR
SWEEP_TABLE = "sweep.json"  # a sweep's tasks: number to parameters (clustertrain.runs.sweeps)
TASKS_DIR = "tasks"  # a sweep's task K has the folder TASKS_DIR/K, laid out as a run folder

# A notebook's call (clustertrain.notebook, run on every rank by clustertrain.rank.notebook), in
# the run folder itself (its mode is set, never a umask's): the pickled function and arguments,
# rank 0's pickled return value and each failing rank's one-line error (.format(rank=N)).
NOTEBOOK_CALL = "notebook-call.pkl"
NOTEBOOK_RESULT = "notebook-result.pkl"
NOTEBOOK_ERROR = "notebook-error-rank{rank}.json"

# A rank that checkpointed on a stop request creates this file in the run folder; the batch
# script then requeues the job, whatever the ranks' exit status.
REQUEUE_FILE = "requeue-requested"

# A rank that exits with this status asks not to be restarted: restarting cannot help (a bad
# configuration, data that is missing). The supervisor ends the job at once with the same status,
# without a restart or a requeue (clustertrain.node.policy.Exit.NO_RESTART), and ``status`` names
# the rank. 79: above sysexits.h's 64-78 and every status of the supervisor's own (2-6), below the
# shell's 126-127 and 128 + a signal; Python itself never exits with it.
NO_RESTART_EXIT = 79

# torchrun's failure report (torchelastic's ChildFailedError, printed by each node's launcher to
# its stderr) gives each failed rank a field a line: ``rank      : 1 (local_rank: 1)``, then
# ``exitcode  : 79 (pid: 4242)``. The supervisor reads the exit codes from it (NO_RESTART_EXIT:
# torchrun itself exits 1 whatever its ranks' codes), and so does a failed job's cause.
# The report lists the ranks it stopped under its "Failures:" and the first one that failed
# under its root cause's heading.
REPORT_FAILURES, REPORT_ROOT = "Failures:", "Root Cause (first observed failure):"
REPORT_RANK = re.compile(r"\brank\s*: (\d{1,9}) \(local_rank: (\d{1,9})\)")
REPORT_EXIT = re.compile(r"\bexitcode\s*: (-?\d{1,4})\b")

# A rank that gave up waiting for the others in clustertrain.env.init_process_group names those
# that never came in these words, ``rank 3 (on node2) never joined the rendezvous``; the cause
# of a failed job (clustertrain.runs.why) reads them back.
ABSENT_RANKS = re.compile(
    r"\b(ranks? [\d, -]{1,200}) \(([^()]{1,300})\) never joined the rendezvous"
)

# Environment variables the batch script exports for the ranks.
ENV_RUN_DIR = "CLUSTERTRAIN_RUN_DIR"
ENV_OUT_DIR = "CLUSTERTRAIN_OUT_DIR"
ENV_REQUEUE_FILE = "CLUSTERTRAIN_REQUEUE_FILE"
ENV_RDZV_TIMEOUT_S = "CLUSTERTRAIN_RDZV_TIMEOUT_S"
# The run folder's event log (clustertrain.rank.events), appended to by the batch script and rank 0.
EVENTS_FILE = "events.jsonl"
ENV_EVENTS_FILE = "CLUSTERTRAIN_EVENTS_FILE"
# Where a script writes its own TensorBoard files, in the run folder (the tracker relay writes
# its own under it too: clustertrain.track.tensorboard).
TENSORBOARD_DIR = "tensorboard"
ENV_TENSORBOARD_DIR = "CLUSTERTRAIN_TENSORBOARD_DIR"
# With `offline: true`, W&B's offline runs go to WANDB_DIR/wandb/offline-run-*, WANDB_DIR being
# the run folder, where the relay finds them to sync (clustertrain.track.wandb).
WANDB_DIR = "wandb"

# A node's NVIDIA GPUs, as a shell glob: without one, an accelerate job trains on CPU across the
# whole world (the launch script checks with compgen, a local run with glob).
NVIDIA_DEVICES = "/dev/nvidia[0-9]*"

# Progress: each rank that calls runtime.heartbeat(step) keeps a file <HEARTBEAT_DIR>/rank-<N>
# (BEAT_PREFIX; one line: its newest step, then its running totals of seconds in
# runtime.compute() sections and of samples, space-separated; its mtime the time of progress)
# under the attempt's log folder, and beside it its node's name (rank-<N>BEAT_NODE_SUFFIX), read
# by one reader (clustertrain.node.beats). On DUMP_SIGNAL a rank appends every thread's stack to
# rank-<N>DUMPS_SUFFIX beside it (faulthandler). What takes the stacks
# (clustertrain.node.stacks, for the watchdog and `clustertrain stacks`) writes each rank's one
# stack to rank-<N>.stack. The batch script's watchdog (clustertrain.node.watchdog) reads them,
# and writes HANG_FILE there when no rank made progress for hang_timeout_s. WINCH: ignored by any
# process that does not ask for it (a terminal's resize signal), so the launchers and scripts
# without the runtime library are safe from it.
ENV_HEARTBEAT_DIR = "CLUSTERTRAIN_HEARTBEAT_DIR"
HEARTBEAT_DIR = "heartbeats"
BEAT_PREFIX = "rank-"
BEAT_NODE_SUFFIX = ".node"
DUMP_SIGNAL = "WINCH"
DUMPS_SUFFIX = ".dumps"
HANG_FILE = "hang.txt"

# Spare nodes (spare_nodes): the batch script trains on the nodes named in ENV_ACTIVE_NODES (a
# comma list) and holds the others. Each of them touches <HEARTBEAT_DIR>/BEACON_PREFIX<node>
# every BEACON_S seconds while its launcher runs; a beacon that goes quiet sends the watchdog to
# its roll call (clustertrain.node.rollcall), which writes the nodes that did not answer in
# LOST_FILE there, one per line, and ends the step; the supervisor starts it again on a spare.
ENV_ACTIVE_NODES = "CLUSTERTRAIN_NODES"
BEACON_PREFIX = "node-"
BEACON_S = 1
LOST_FILE = "lost-nodes"

# The launch script sets these on each node to the interface of its route to the head node
# (``python -m clustertrain.node.netif``), unless the job sets them (socket_ifname).
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

# Each node's node-check record, under the attempt's log folder: <node>.json for the verdict,
# and <node>.ifname, the interface a container's launch script reads (the image need not have
# clustertrain to find it).
NODE_CHECK_DIR = "node-check"
# With qualify, the node check runs on the nodes the supervisor names here (a comma list, and
# their count): every node of the allocation before the first step, and before each restart
# inside it the nodes the job still holds (a lost node is no longer one of them).
ENV_CHECK_NODES, ENV_CHECK_COUNT = "CLUSTERTRAIN_CHECK_NODES", "CLUSTERTRAIN_CHECK_COUNT"

# Variables the batch and launch scripts set and read themselves (and those the launchers set
# for each rank): a user's value for one would change what the scripts do.
SCRIPT_VARIABLES = frozenset(
    {"HEAD_NODE", "RDZV_PORT", "RDZV_IS_HOST", "LOG_DIR", "STATUS", "SRUN_PID", "VIRTUAL_ENV"}
    | {"IFNAME", "CHECK_START", "WATCHDOG_PID", "HANG", "STEP_RESTARTS"}
    | {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"}
    | {"MASTER_ADDR", "MASTER_PORT", "PATH", "PYTHONUNBUFFERED"}
)
# Prefixes of the variables Slurm, the launchers and clustertrain itself own.
SCRIPT_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "SRUN_",
    "SBATCH_",
    "SALLOC_",
    "CLUSTERTRAIN_",
    "TORCHELASTIC_",
)

# torchrun and accelerate expand ${rank} themselves and prefix each of a rank's lines with it,
# when this variable holds the template.
ENV_RANK_PREFIX = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "
# torch also prefixes a rank's uncaught exception with "[rankN]:"; the reader strips both.
RANK_PREFIX = re.compile(r"(?:\[rank(\d+)\]: ?)+")
# torch before 2.0 (Debian 12's 1.13, in container images) ignores the template: its lines carry
# "[<role><local rank>]:", and torchrun's role is "default". The global rank is not in them.
LOCAL_RANK_PREFIX = re.compile(r"\[default(\d+)\]:")


def rendezvous_port(job_id: int) -> int:
    """The rendezvous port of a Slurm job; the batch script computes the same in bash."""
    return PORT_BASE + job_id % PORT_SPAN


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2-5``: how the watchdog's hang line names ranks, and the cause
    read back from it (clustertrain.runs.why) names them the same way."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][-1] + 1:
            spans[-1].append(rank)
        else:
            spans.append([rank])
    said = ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in spans)
    return f"rank{'s' if sum(map(len, spans)) > 1 else ''} {said}"

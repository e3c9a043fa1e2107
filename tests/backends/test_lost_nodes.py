"""Which node a NODE_FAIL lost, from Slurm's record of its nodes (sacctmgr's node events): srun's
"Node failure on" is a message slurmctld sends in the same pass that stops srun, so it may never
be printed. The real cluster's side: tests/e2e/test_node_failure_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.backends.slurm import Slurm
from clustertrain.backends.slurm.parse import parse_down_events, parse_spans
from clustertrain.errors import UserError
from clustertrain.jobstate import Accounting, JobState
from clustertrain.runs import Run, why
from tests.backends.test_slurm_parsing import FakeRunner

# sacct -j 7 -n -P -o JobID,State,ExitCode,ElapsedRaw,MaxRSS,TotalCPU of a job whose node2
# stopped answering (Slurm 24.11, the local cluster's link-cut test).
SACCT_NODE_FAIL = "7|NODE_FAIL|1:0|37||00:00.004\n7.batch|CANCELLED|0:15|38||00:00.004\n"
# sacct -j 7 -X --duplicates -n -P -o State,NodeList,Start,End
SPAN = "NODE_FAIL|node[1-2]|2026-12-08T00:17:46|2026-12-08T00:18:23\n"
# sacctmgr -n -P show event nodes=node[1-2] start=... end=... format=NodeName,TimeStart,State
EVENTS = (
    "node1|2026-12-08T00:10:02|DRAIN\n"  # drained earlier, still drained: no loss of this job
    "node2|2026-12-08T00:18:23|DOWN*\n"  # not responding, as Slurm writes it
    "node2|2026-12-08T00:18:40|DOWN+DRAIN\n"
)


def test_each_node_fail_allocation_is_a_span_to_a_minute_past_its_end() -> None:
    assert parse_spans(SPAN) == [("node[1-2]", "2026-12-08T00:17:46", "2026-12-08T00:19:23")]
    requeued = (
        "NODE_FAIL|node[1-2]|2026-12-08T23:50:00|2026-12-08T23:59:31\n"
        "COMPLETED|node[3-4]|2026-12-09T00:00:40|2026-12-09T00:02:00\n"
    )
    assert parse_spans(requeued) == [("node[1-2]", "2026-12-08T23:50:00", "2026-12-09T00:00:31")]


@pytest.mark.parametrize(
    "said",
    [
        "",
        "FAILED|node1|2026-12-08T00:17:46|2026-12-08T00:18:23\n",
        "NODE_FAIL|node1|2026-12-08T00:17:46|Unknown\n",
        "NODE_FAIL|node1|None|None\n",
        "NODE_FAIL|-o|2026-12-08T00:17:46|2026-12-08T00:18:23\n",  # never an option of sacctmgr's
        "NODE_FAIL|$(id)|2026-12-08T00:17:46|2026-12-08T00:18:23\n",
        "NODE_FAIL|node1|2026-13-08T00:17:46|2026-12-08T00:18:23\n",  # a time's shape, not one
        "NODE_FAIL|node1|2026-12-08T00:17:46|2026-12-08T00:18:23|x\n",
    ],
)
def test_a_span_sacct_did_not_print_is_left_out(said: str) -> None:
    assert parse_spans(said) == []


def test_down_events_from_the_jobs_start_name_the_lost_nodes_once() -> None:
    assert parse_down_events(EVENTS, "2026-12-08T00:17:46") == ("node2",)
    assert parse_down_events("node3|2026-12-08T00:10:00|DOWN\n", "2026-12-08T00:17:46") == ()
    assert parse_down_events("node3|2026-12-08T00:18:00|DOWNTIME\n", "2026-12-08T00:17:46") == ()
    hostile = "$(id)|2026-12-08T00:18:23|DOWN\nnode\x1b[2J|2026-12-08T00:18:23|DOWN\n"
    assert parse_down_events(hostile, "2026-12-08T00:17:46") == ()


def test_accounting_of_a_node_fail_asks_the_node_events_and_of_others_never() -> None:
    runner = FakeRunner(
        {
            "sacct -j 7 -X --duplicates": (0, SPAN, ""),
            "sacct -j 7": (0, SACCT_NODE_FAIL, ""),
            "sacctmgr -n -P show event": (0, EVENTS, ""),
        }
    )
    found = Slurm(runner).accounting("7")
    assert found is not None and found.lost_nodes == ("node2",)
    asked = [list(argv) for argv in runner.calls if argv[0] == "sacctmgr"]
    assert asked == [
        ["sacctmgr", "-n", "-P", "show", "event", "nodes=node[1-2]",
         "start=2026-12-08T00:17:46", "end=2026-12-08T00:19:23", "format=NodeName,TimeStart,State"]
    ]  # fmt: skip
    failed = FakeRunner({"sacct -j 8": (0, "8|FAILED|1:0|37||\n", "")})
    assert Slurm(failed).accounting("8").lost_nodes == ()  # type: ignore[union-attr]
    assert [argv[0] for argv in failed.calls] == ["sacct", "sacct"]  # no NODE_FAIL: no events
    # No events kept (or sacctmgr refused): srun's words are all there is.
    refused = FakeRunner(
        {"sacct -j 7 -X --duplicates": (0, SPAN, ""), "sacct -j 7": (0, SACCT_NODE_FAIL, "")}
    )
    assert Slurm(refused).accounting("7").lost_nodes == ()  # type: ignore[union-attr]
    with pytest.raises(UserError):
        Slurm(runner).lost_nodes("7 nodes=x")


def test_the_headline_names_the_node_accounting_recorded_when_srun_said_nothing(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, "7", "mnist", "2026-12-08T00:17:40+00:00", 2, 1, "torchrun")
    run.logs_dir.mkdir(parents=True)
    (run.logs_dir / "slurm-7.err").write_text(
        "slurmstepd-node1: error: *** JOB 7 ON node1 CANCELLED AT 2026-12-08T00:18:23 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )
    state = JobState("7", "NODE_FAIL", nodes="node[1-2]")
    kept = Accounting("7", "NODE_FAIL", "1:0", 37, lost_nodes=("node2",))
    told = why.cause(why.read(run, state, kept))
    assert told is not None and told.headline.startswith(
        "node2 lost: Slurm declared it down and ended the job (NODE_FAIL)"
    ), told
    untold = why.cause(why.read(run, state, None))
    assert untold is not None and untold.headline.startswith("a node lost"), untold

"""Parsing what Slurm's commands print, with a fake runner: no cluster needed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from clustertrain.backends.slurm import (
    Slurm,
    SlurmUnreachable,
    parse_nodes,
    parse_partitions,
    parse_sacct,
    parse_scontrol_job,
)
from clustertrain.backends.slurm.parse import lacks_configuration, unreachable
from clustertrain.errors import UserError

SCONTROL_JOB = (
    "JobId=42 JobName=mnist UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) "
    "Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0 RunTime=00:01:07 TimeLimit=00:30:00 "
    "NodeList=node[1-2] BatchHost=node1 NumNodes=2 WorkDir=/work/main\n"
)
PARTITIONS = (
    "PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED State=UP Nodes=n[1-4]\n"
    "PartitionName=gpu Default=NO MaxNodes=2 MaxTime=1-00:00:00 State=DOWN Nodes=g[1-2]\n"
)
SINFO = (
    "n1|debug*|8|4096|gpu:2|idle\n"
    "n2|debug*|8|4096+|gpu:a100:4(S:0-1)|mix\n"
    "n2|gpu|8|4096+|gpu:a100:4(S:0-1)|mix\n"
    "n3|debug*|16|8000|(null)|drain*\n"
)


class FakeRunner:
    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []  # type: list[Sequence[str]]

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        code, out, err = next(
            (v for k, v in self.answers.items() if " ".join(argv).startswith(k)),
            (1, "", "error: unknown"),
        )
        return subprocess.CompletedProcess(list(argv), code, out, err)


def test_scontrol_job_fields() -> None:
    state = parse_scontrol_job("42", SCONTROL_JOB)
    assert (state.state, state.nodes, state.elapsed, state.restarts) == (
        "RUNNING",
        "node[1-2]",
        "00:01:07",
        2,
    )
    assert not state.finished and state.reason == ""


def test_sacct_takes_the_first_word_of_the_state() -> None:
    state = parse_sacct("7", "7|CANCELLED by 0|node1|00:00:09|0:15\n")
    assert state.state == "CANCELLED" and state.finished and state.exit_code == "0:15"


def test_state_falls_back_from_scontrol_to_sacct_to_the_completion_log() -> None:
    runner = FakeRunner(
        {
            "scontrol show job": (1, "", "slurm_load_jobs error: Invalid job id specified"),
            "sacct -j": (1, "", "Slurm accounting storage is disabled"),
            "sacct --completion": (0, "9|COMPLETED|node[1-2]|00:00:31\n", ""),
        }
    )
    state = Slurm(runner).state("9")
    assert state.state == "COMPLETED" and state.nodes == "node[1-2]"
    assert [c[0] for c in runner.calls] == ["scontrol", "sacct", "sacct"]


def test_a_job_no_one_remembers_is_unknown() -> None:
    gone = {"scontrol show job": (1, "", "slurm_load_jobs error: Invalid job id specified")}
    assert Slurm(FakeRunner(gone)).state("5").state == "UNKNOWN"


@pytest.mark.parametrize(
    "error",
    [
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host",
        "",
    ],
)
def test_slurm_that_cannot_be_asked_is_not_a_job_state(error: str) -> None:
    runner = FakeRunner({"scontrol show job": (1, "", error)})
    with pytest.raises(SlurmUnreachable, match="cannot ask Slurm about job 5"):
        Slurm(runner).state("5")
    assert [c[0] for c in runner.calls] == ["scontrol"]  # no stale answer from accounting


@pytest.mark.parametrize("job_id", ["5;id", "-1", "", "5 6", "1_", "x" * 20])
def test_only_job_ids_reach_slurm(job_id: str) -> None:
    runner = FakeRunner({})
    with pytest.raises(UserError, match="not a Slurm job id"):
        Slurm(runner).state(job_id)
    with pytest.raises(UserError, match="not a Slurm job id"):
        Slurm(runner).cancel(job_id)
    assert runner.calls == []


def test_partitions_and_nodes() -> None:
    debug, gpu = parse_partitions(PARTITIONS)
    assert (debug.default, debug.max_nodes, debug.max_time_s) == (True, None, None)
    assert (gpu.max_nodes, gpu.max_time_s, gpu.state) == (2, 86400, "DOWN")
    nodes = {n.name: n for n in parse_nodes(SINFO)}
    assert nodes["n2"].partitions == ("debug", "gpu") and nodes["n2"].gpus == 4
    assert nodes["n1"].gpus == 2 and nodes["n3"].gpus == 0 and not nodes["n3"].usable


def test_cancel_failure_is_one_line() -> None:
    runner = FakeRunner(
        {
            "scancel": (
                1,
                "",
                "scancel: error: Kill job error on job id 3: Invalid job id specified\n",
            )
        }
    )
    with pytest.raises(UserError, match="Invalid job id"):
        Slurm(runner).cancel("3")


@pytest.mark.parametrize(
    "error",
    [
        "scancel: error: Kill job error on job id 3: Unable to contact slurm controller "
        "(connect failure)",
        "scancel: error: _establish_config_source: failed to fetch config\n"
        "scancel: fatal: Could not establish a configuration source",
    ],
)
def test_cancel_while_the_controller_cannot_be_reached_says_nothing_was_cancelled(
    error: str,
) -> None:
    with pytest.raises(SlurmUnreachable, match="nothing was cancelled") as raised:
        Slurm(FakeRunner({"scancel": (1, "", error)})).cancel("3")
    assert "cannot cancel job 3: Slurm's controller cannot be reached" in str(raised.value)


def test_what_says_slurm_cannot_be_asked() -> None:
    assert unreachable("slurm_load_jobs error: Unable to contact slurm controller")
    assert unreachable("error: _establish_config_source: failed to fetch config")
    assert not unreachable("scancel: error: Kill job error on job id 3: Invalid job id specified")
    assert lacks_configuration("fatal: Could not establish a configuration source")
    assert not lacks_configuration("Unable to contact slurm controller (connect failure)")


def test_accounting_says_it_was_the_source() -> None:
    assert parse_sacct("7", "7|COMPLETED|node1|00:00:09|0:0\n").source == "sacct"
    assert parse_scontrol_job("42", SCONTROL_JOB).source == "slurm"


def test_missing_slurm_commands_are_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    # Slurm cannot be asked: status and the others answer from the run folder instead.
    with pytest.raises(SlurmUnreachable, match="scontrol: not found"):
        Slurm().state("1")


def test_node_states_and_the_queue_as_the_local_cluster_reads_them() -> None:
    runner = FakeRunner(
        {
            "sinfo -h -N": (0, "node1 idle\nnode2 allocated\n", ""),
            "squeue -h -o %A -t R,CG": (0, "7\n", ""),
            "squeue -h -o %A": (0, "7\n8\n", ""),
        }
    )
    slurm = Slurm(runner)
    assert slurm.node_states() == {"node1": "idle", "node2": "allocated"}
    assert slurm.job_ids() == ["7", "8"] and slurm.job_ids("R,CG") == ["7"]
    slurm.cancel_all(["7", "8"])
    assert runner.calls[-1] == ("scancel", "7", "8")
    # While slurmctld starts it does not answer: no states, no jobs, no exception.
    silent = Slurm(FakeRunner({}))
    assert silent.node_states() == {} and silent.job_ids() == []


def test_a_conf_bound_runner_and_no_hidden_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clustertrain import api
    from clustertrain.backends import slurm

    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("CLUSTERTRAIN_CLUSTER_DIR", str(tmp_path))
    bound = tmp_path / "other.conf"
    assert slurm.slurm_environ(bound)["SLURM_CONF"] == str(bound)
    assert "SLURM_CONF" not in slurm.slurm_environ()  # the backend guesses nothing
    # A local cluster that is up is not used unless SLURM_CONF names it (`cluster up` says how).
    (tmp_path / "slurm.conf").write_text("")
    assert "SLURM_CONF" not in api.slurm().environ
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert api.slurm().environ["SLURM_CONF"] == str(tmp_path / "slurm.conf")


def test_the_slurm_module_does_not_import_the_local_cluster() -> None:
    code = (
        "import os, sys; os.environ.pop('SLURM_CONF', None); "
        "import clustertrain.backends.slurm as s; "
        "s.slurm_environ(); s.Slurm(); print('clustertrain.localcluster' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"


# sacct -j 42 -n -P -o JobID,State,ExitCode,ElapsedRaw,MaxRSS,TotalCPU, as Slurm 22.05 prints it
# for a 2-node job: the job's own row, its batch step, its extern step and step 0.
SACCT_ACCOUNTING = """\
42|FAILED|1:0|40||00:51.230
42.batch|FAILED|1:0|40|20528K|00:01.004
42.extern|COMPLETED|0:0|40|1.5M|00:00.001
42.0|FAILED|1:0|37|1G|01:02:50.219
43.0|COMPLETED|0:0|5|1K|00:01
"""


def test_a_jobs_accounting_is_its_own_row_and_its_steps() -> None:
    from clustertrain.backends.slurm import parse_accounting

    found = parse_accounting("42", SACCT_ACCOUNTING)
    assert found is not None
    assert (found.state, found.exit_code, found.elapsed_s) == ("FAILED", "1:0", 40)
    assert [s.step for s in found.steps] == ["batch", "extern", "0"]
    assert [s.max_rss_kb for s in found.steps] == [20528, 1536, 1 << 20]
    assert found.steps[2].total_cpu_s == 3770.219 and found.steps[0].total_cpu_s == 1.004
    assert parse_accounting("44", SACCT_ACCOUNTING) is None  # no row of its own
    said = parse_accounting("42", "42|COMPLETED|0:0|x|$(id)K|later\n")
    assert said is not None and said.elapsed_s == 0 and said.steps == ()


# sacct -j 42 -X -D -n -P -o JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES, as Slurm
# prints a job requeued once on a cluster that accounts for GPUs (AccountingStorageTRES=
# gres/gpu): one row per allocation, the newest last; another job's row besides.
SACCT_ALLOCATIONS = """\
42|REQUEUED|2026-12-07T20:00:00|2026-12-07T20:00:12|2026-12-07T20:05:00|288|billing=4,cpu=4,gres/gpu=2,mem=8G,node=2
42|COMPLETED|2026-12-07T20:05:01|2026-12-07T20:05:31|2026-12-07T20:10:31|300|billing=4,cpu=4,gres/gpu=2,mem=8G,node=2
43|COMPLETED|2026-12-07T20:00:00|2026-12-07T20:00:01|2026-12-07T20:00:02|1|cpu=1,node=1
"""


def test_a_jobs_allocations_are_its_attempts_with_nodes_and_gpus() -> None:
    from datetime import datetime

    from clustertrain.backends.slurm import parse_allocations

    found = parse_allocations("42", SACCT_ALLOCATIONS)
    assert [(a.state, a.elapsed_s, a.nodes, a.gpus) for a in found] == [
        ("REQUEUED", 288, 2, 2),
        ("COMPLETED", 300, 2, 2),
    ]
    # Local time, as sacct prints it: the span is the same in any time zone.
    first = found[0]
    assert first.start is not None and first.submit is not None
    assert first.start - first.submit == 12.0
    assert first.submit == datetime(2026, 12, 7, 20, 0, 0).timestamp()
    assert all(a.unreadable == () for a in found)
    assert [a.gpus for a in parse_allocations("43", SACCT_ALLOCATIONS)] == [None]  # none named


def test_an_arrays_allocations_are_its_tasks_not_its_pending_rest() -> None:
    from clustertrain.backends.slurm import parse_allocations

    text = (
        "50_0|COMPLETED|2026-12-07T20:00:00|2026-12-07T20:00:01|2026-12-07T20:01:01|60|node=1,gres/gpu:a100=1\n"
        "50_1|RUNNING|2026-12-07T20:00:00|2026-12-07T20:00:02|Unknown|30|node=1,gres/gpu:a100=1\n"
        "50_[2-5]|PENDING|2026-12-07T20:00:00|Unknown|Unknown|0|\n"
        "500_1|COMPLETED|2026-12-07T20:00:00|2026-12-07T20:00:02|2026-12-07T20:00:03|1|node=1\n"
    )
    found = parse_allocations("50", text)
    assert [(a.job_id, a.gpus, a.end is None) for a in found] == [
        ("50_0", 1, False),
        ("50_1", 1, True),  # still running: no end yet, and nothing unreadable
    ]
    assert all(a.unreadable == () for a in found)


def test_what_sacct_printed_that_is_no_value_is_unreadable() -> None:
    from clustertrain.backends.slurm import parse_allocations

    text = "7|$(id)|yesterday|2026-12-07T20:00:01|\x1b[2J|-5|node=two,gres/gpu=\n7|x|y\n"
    (found,) = parse_allocations("7", text)
    assert found.state == "UNKNOWN"
    assert (found.submit, found.end, found.elapsed_s, found.nodes, found.gpus) == (None,) * 5
    assert set(found.unreadable) == {"Submit", "End", "ElapsedRaw", "AllocTRES"}
    assert parse_allocations("7", "7|COMPLETED|a|b|c|1|garbage\n")[0].unreadable[-1] == "AllocTRES"


def test_allocations_ask_sacct_for_every_attempt_and_none_without_accounting() -> None:
    runner = FakeRunner({"sacct -j 42 -X --duplicates": (0, SACCT_ALLOCATIONS, "")})
    found = Slurm(runner).allocations("42")
    assert found is not None and len(found) == 2
    assert runner.calls[-1][-1] == "JobID,State,Submit,Start,End,ElapsedRaw,AllocTRES"
    disabled = FakeRunner({"sacct": (1, "", "Slurm accounting storage is disabled")})
    assert Slurm(disabled).allocations("42") is None
    with pytest.raises(UserError):
        Slurm(FakeRunner({})).allocations("42; rm -rf /")


def test_report_hears_why_a_backend_has_no_allocations(tmp_path: Path) -> None:
    from clustertrain.backends.local import LocalBackend
    from clustertrain.backends.slurm import SlurmBackend
    from clustertrain.runs import Run

    def run(job_id: str) -> Run:
        return Run(tmp_path, job_id, "mnist", "2026-12-07T20:00:00+00:00", 1, 1, "torchrun")

    def gone(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise SlurmUnreachable("sacct: not found; run clustertrain where Slurm's commands are")

    disabled = FakeRunner({"sacct": (1, "", "Slurm accounting storage is disabled")})
    assert SlurmBackend(Slurm(disabled)).priced(run("42")) == (
        None, "no accounting: sacct answered nothing, no slurmdbd?",
    )  # fmt: skip
    assert SlurmBackend(Slurm(gone)).priced(run("42")) == (
        None, "no accounting: sacct: not found; run clustertrain where Slurm's commands are",
    )  # fmt: skip
    kept = FakeRunner({"sacct": (0, SACCT_ALLOCATIONS, "")})
    found, why = SlurmBackend(Slurm(kept)).priced(run("42"))
    assert found is not None and len(found) == 2 and why == ""
    assert LocalBackend().priced(run("local-7")) == (None, "no accounting: a local run")

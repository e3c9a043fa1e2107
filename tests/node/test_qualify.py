"""Qualification (clustertrain.node.qualify) without a cluster: the pairwise-quick schedule, the
verdict from figures, and the supervisor's acts on it (a spare swapped in, the end, a warning)
under the fake Slurm of tests/node/test_supervisor.py. The real probes run on the local cluster
in tests/e2e/test_qualify_e2e.py, with a link made slow by tbf."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from clustertrain import protocol
from clustertrain.node import policy, qualify
from tests.node.test_supervisor import Job, crash, lose, ok

CHECK = ["srun", "--nodes=3", "python", "-m", "clustertrain.node.nodecheck", "probe",
         {"expand": "$LOG_DIR/node-check"}, "--qualify"]  # fmt: skip


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 16])
def test_each_round_pairs_a_node_once_and_three_rounds_give_each_node_its_partners(
    count: int,
) -> None:
    schedule = qualify.pairs(count)
    assert len(schedule) == min(3, count - 1 + count % 2)
    for round_ in schedule:
        members = [node for pair in round_ for node in pair]
        assert len(members) == len(set(members))  # at once: no node twice in a round
    pairs = [pair for round_ in schedule for pair in round_]
    assert len(pairs) == len(set(pairs))  # no pair measured twice
    partners = {n: {b if a == n else a for a, b in pairs if n in (a, b)} for n in range(count)}
    assert all(len(p) >= min(2, count - 1) for p in partners.values())
    if count <= 4:  # few nodes: every pair
        assert set(pairs) == set(itertools.combinations(range(count), 2))


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([["a"], ["a"], ["a"], ["a"]], [[0], [1], [2], [3]]),  # one host (the local cluster)
        ([["a"], ["b"], ["c"], ["d"]], [[0, 1, 2, 3]]),  # separate hosts: at once
        ([["a"], ["a"], ["b"], ["c"]], [[0, 2, 3], [1]]),  # a's nodes take turns, not b, c
        ([["a"], [None], ["b"]], [[0, 2], [1]]),  # an unknown host shares with everyone
        ([["a", "b"], ["c", "d"], ["a", "c"]], [[0, 1], [2]]),  # pairs: both hosts count
        ([["a", "a"], ["b", "c"]], [[0, 1]]),  # a pair within one host keeps to it
    ],
)
def test_steps_that_share_a_host_take_turns_and_the_others_run_at_once(
    hosts: list[list[str | None]], expected: list[list[int]]
) -> None:
    assert qualify.waves(hosts) == expected


def test_a_node_without_a_gpu_driver_takes_the_probes_without_torch() -> None:
    assert not qualify.gpus_here(lambda path: False)
    for sign in ("/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd"):
        assert qualify.gpus_here({sign}.__contains__)


def _probe(node: str, gflops: float | None = 40.0, link: float | None = 500.0) -> dict[str, Any]:
    found: dict[str, Any] = {"node": node, "host": node, "head": "node1", "address": "10.0.0.1"}
    return found | {"gflops": gflops, "link_mib_s": link}


def test_a_slow_link_or_a_slow_node_is_flagged_with_its_figure_against_the_median() -> None:
    probes = [_probe("node1"), _probe("node2", link=450.0), _probe("node3", link=1.2)]
    assert qualify.flag(probes, 2.0, 10.0) == {
        "node3": "link 1.2 MiB/s, 375.0x slower than the median 450 MiB/s"
    }
    slow = [_probe("node1", 40.0), _probe("node2", 12.0), _probe("node3", 38.0)]
    assert list(qualify.flag(slow, 3.0, 10.0)) == ["node2"]
    assert qualify.flag(slow, 3.5, 10.0) == {}  # 38 / 12 = 3.2: within a threshold of 3.5
    failed = [_probe("node1"), {**_probe("node2"), "qualify_error": "joining the others: x"}]
    assert qualify.flag(failed, 2.0, 10.0) == {
        "node2": "qualification failed: joining the others: x"
    }


def test_each_figure_has_its_own_threshold_set_from_the_healthy_spread() -> None:
    """Healthy links on a shared 2-core host read up to 6.1x under their median, healthy
    matmuls within 1.12x: a link 6x slower is no flag, a matmul 2.5x slower is."""
    probes = [_probe("node1"), _probe("node2", 16.0, 83.0), _probe("node3"), _probe("node4")]
    assert list(qualify.flag(probes, 2.0, 10.0)) == ["node2"]
    assert qualify.flag(probes, 2.0, 10.0)["node2"].startswith("compute 16 GFLOP/s, 2.5x")


def test_two_nodes_alone_cannot_say_whose_link_is_slow_and_neither_is_flagged() -> None:
    assert qualify.flag([_probe("node1", link=1.0), _probe("node2", link=1.0)], 2.0, 10.0) == {}
    assert qualify.summary([_probe("node1", 40.123, None)]) == "node1=40.1GF/s,-"


def _steps(job: Job) -> list[list[str]]:
    return [c for c in job.slurm.calls if c[0] == "srun" and "clustertrain.node.nodecheck" not in c]


def _qualifying(
    tmp_path: Path, probes: list[dict[str, Any]], *later: list[dict[str, Any]], **plan: Any
) -> Job:
    """A job whose node checks find ``probes``, then each of ``later`` (before restarts); each
    check's nodes are those the supervisor named, in ``job.checked``."""
    job = Job(tmp_path, plan.pop("runs", [ok]), node_check=CHECK, qualify=True, **plan)
    real_run, found = job.slurm.run, [probes, *later]
    job.checked = []  # type: ignore[attr-defined]

    def run(argv: Any, cwd: str | None = None, quiet: bool = False) -> int:
        if "clustertrain.node.nodecheck" in argv:
            job.checked.append(job.env[protocol.ENV_CHECK_NODES])  # type: ignore[attr-defined]
            folder = Path(job.env["LOG_DIR"], protocol.NODE_CHECK_DIR)
            folder.mkdir(parents=True)  # a new folder each time: the one before is kept aside
            for probe in found.pop(0):
                (folder / f"{probe['node']}.json").write_text(json.dumps(probe))
        return real_run(argv, cwd, quiet)

    job.slurm.run = run  # type: ignore[method-assign]
    return job


def test_a_flagged_node_is_swapped_for_a_spare_before_the_first_step_and_let_go(
    tmp_path: Path,
) -> None:
    slow = [_probe("node1"), _probe("node2", link=1.5), _probe("node3")]
    job = _qualifying(tmp_path, slow, spare_nodes=1)
    assert job.run() == 0
    assert _steps(job)[0][2] == "--nodelist=node1,node3"  # trained without node2
    assert ["JobId=42", "NodeList=node1,node3"] in job.scontrol()  # node2 handed back
    names = [(name, values.get("nodes")) for name, values in job.events]
    assert ("qualified", "node1 node2 node3") in names and ("flagged", "node2") in names
    assert "qualification flagged node2: link 1.5 MiB/s" in job.out.getvalue()


def test_a_flagged_node_with_no_spare_ends_the_job_with_6_before_training(
    tmp_path: Path,
) -> None:
    probes = [_probe("node1", 40.0), _probe("node2", 9.0), _probe("node3", 41.0)]
    job = _qualifying(tmp_path, probes, nodes=3)
    assert job.run() == policy.Exit.DISQUALIFIED == 6
    assert _steps(job) == []
    assert "qualification flagged node2: compute 9 GFLOP/s" in job.err.getvalue()
    assert "on_flagged: warn trains on it" in job.err.getvalue()


def test_with_warn_a_flagged_node_trains_and_the_job_says_so(tmp_path: Path) -> None:
    probes = [_probe("node1", 40.0), _probe("node2", 9.0), _probe("node3", 41.0)]
    job = _qualifying(tmp_path, probes, nodes=3, on_flagged="warn")
    assert job.run() == 0
    assert len(_steps(job)) == 1
    assert "training on it anyway (on_flagged: warn)" in job.out.getvalue()


def test_nothing_flagged_trains_on_the_first_nodes_and_keeps_the_spare(tmp_path: Path) -> None:
    job = _qualifying(tmp_path, [_probe("node1"), _probe("node2"), _probe("node3")], spare_nodes=1)
    assert job.run() == 0
    assert _steps(job)[0][2] == "--nodelist=node1,node2" and job.scontrol() == []


@pytest.mark.parametrize(
    "bad", [{"compute_threshold": 1.0}, {"link_threshold": "3"}, {"on_flagged": "ignore"}]
)
def test_a_plan_with_a_bad_qualification_value_is_refused(tmp_path: Path, bad: Any) -> None:
    from clustertrain.node.supervisor import Plan

    raw = {"step": ["srun"], "node_check": None, "logs_dir": "x", "nodes": 2, "spare_nodes": 0,
           "hang_timeout_s": 60, "hang_on_quiet": False, "max_restarts": 0, "max_requeues": 3,
           "requeue_on_node_failure": False, "tasks": None, "qualify": True, **bad}  # fmt: skip
    with pytest.raises(TypeError):
        Plan.from_dict(raw)


def test_before_a_restart_the_nodes_still_held_are_qualified_again_and_a_bad_one_swapped(
    tmp_path: Path,
) -> None:
    """node2 crashes the step and is now slow: the restart's qualification swaps it for the
    spare; the first check's probes stay in node-check-1."""
    healthy = [_probe("node1"), _probe("node2"), _probe("node3")]
    now = [_probe("node1"), _probe("node2", 9.0), _probe("node3")]
    job = _qualifying(tmp_path, healthy, now, spare_nodes=1, max_restarts=1, runs=[crash, ok])
    assert job.run() == 0
    assert job.checked == ["node1,node2,node3", "node1,node2,node3"]  # type: ignore[attr-defined]
    assert [s[2] for s in _steps(job)] == ["--nodelist=node1,node2", "--nodelist=node1,node3"]
    assert (tmp_path / "logs" / "attempt-0" / "node-check-1" / "node2.json").exists()
    names = [name for name, _ in job.events]
    assert names == ["started", "node_check", "qualified", "restarted", "node_check",
                     "qualified", "flagged", "ended"]  # fmt: skip


def test_after_a_lost_node_the_qualification_checks_the_nodes_left_not_the_lost_one(
    tmp_path: Path,
) -> None:
    first = [_probe("node1"), _probe("node2"), _probe("node3"), _probe("node4")]
    left = [_probe("node1"), _probe("node3"), _probe("node4")]
    job = _qualifying(tmp_path, first, left, spare_nodes=2, runs=[lose("node2"), ok])
    assert job.run() == 0
    assert job.checked == ["node1,node2,node3,node4", "node1,node3,node4"]  # type: ignore[attr-defined]
    assert _steps(job)[1][2] == "--nodelist=node1,node3"


def test_a_node_flagged_before_a_restart_with_no_spare_ends_the_job_with_6(tmp_path: Path) -> None:
    healthy = [_probe("node1"), _probe("node2"), _probe("node3")]
    now = [_probe("node1"), _probe("node2", link=0.5), _probe("node3")]
    job = _qualifying(tmp_path, healthy, now, nodes=3, max_restarts=1, runs=[crash, ok])
    assert job.run() == policy.Exit.DISQUALIFIED
    assert len(_steps(job)) == 1 and "qualification flagged node2: link 0.5" in job.err.getvalue()

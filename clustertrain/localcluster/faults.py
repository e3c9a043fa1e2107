"""Real faults on the local cluster's nodes, to see what a job does then.

``fail`` makes a node disappear (every process in its namespace killed, or its link cut).
``degrade`` makes it slow, for real: a ``tbf`` queue on both ends of its link (this kernel has
tbf and htb, not netem), so that what it sends and what it receives goes at ``--link-rate``,
and a CPU quota (the cpu cgroup's CFS bandwidth) on every process of its namespace, slurmd
included, so that the job steps it starts later inherit it. ``heal`` removes both; ``down``
heals every node first. Namespace layout only: there a node is a host of its own.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

from clustertrain.errors import UserError

from . import daemons, netns
from .layout import Layout

# cgroup v1's cpu hierarchy (this machine's), else cgroup v2's unified one.
CGROUP_V1, CGROUP_V2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
PERIOD_US = 100_000
_RATE = re.compile(r"([0-9]{1,6})(kbit|mbit|gbit)")
_UNITS = {"kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
_CPU = re.compile(r"([0-9]{1,3})%")


def parse_rate(text: str) -> int:
    """``10mbit`` as bits a second: 8kbit to 100gbit, as tc writes rates."""
    match = _RATE.fullmatch(text)
    bits = int(match[1]) * _UNITS[match[2]] if match else 0
    if not 8_000 <= bits <= 100_000_000_000:
        raise UserError(
            f"link-rate: {text!r} is not a rate from 8kbit to 100gbit; write it like 10mbit"
        )
    return bits


def parse_cpu(text: str) -> int:
    """``25%`` as a percentage of one CPU, 1 to 100."""
    match = _CPU.fullmatch(text)
    if not match or not 1 <= int(match[1]) <= 100:
        raise UserError(f"cpu: {text!r} is not a share from 1% to 100%; write it like 25%")
    return int(match[1])


def node_names(state_dir: Path, node: str) -> netns.Names:
    """The running cluster's network names, once ``node`` is known to be one of its nodes."""
    record = daemons.read_record(Path(state_dir).absolute())
    if record is None:
        raise UserError("no local cluster is up: run `clustertrain cluster up` first")
    layout: Layout = daemons.record_layout(record)
    if node not in layout.node_names:
        raise UserError(
            f"NODE: {node!r} is not a node of the local cluster; nodes: "
            f"{', '.join(layout.node_names)}"
        )
    if layout.network != "namespaces":
        raise UserError(
            "this needs the namespace layout, where a node is a host of its own: "
            "run `clustertrain cluster down`, then `cluster up`"
        )
    return names_of(record)


def names_of(record: dict) -> netns.Names:
    return netns.Names(record["id"], list(daemons.record_layout(record).host_addresses))


def fail(state_dir: Path, node: str, cut_link: bool = False) -> str:
    """Make one node of the running cluster disappear; the next ``up`` starts afresh."""
    names = node_names(state_dir, node)
    record = daemons.read_record(Path(state_dir).absolute())
    assert record is not None
    record["failed"] = {**record.get("failed", {}), node: "link cut" if cut_link else "killed"}
    daemons.write_record(Path(state_dir).absolute(), record)
    killed = netns.fail(names, node, cut_link)
    how = "its link is down" if cut_link else f"{len(killed)} process(es) killed"
    return f"{node}: {how}; `clustertrain cluster up` restarts the cluster afresh"


def degrade(state_dir: Path, node: str, rate: str | None, cpu: str | None) -> str:
    """Slow ``node`` down: its link to ``rate`` both ways, its processes to ``cpu`` of a CPU.
    Both are checked before anything changes."""
    if rate is None and cpu is None:
        raise UserError("degrade: give --link-rate, --cpu or both")
    bits = parse_rate(rate) if rate is not None else None
    share = parse_cpu(cpu) if cpu is not None else None
    names = node_names(state_dir, node)
    said = []
    if bits is not None:
        burst = max(1600, bits // 8 // 100)  # 10 ms of the rate: tc needs one at least
        for link, space in ((names.host_link(node), None), ("eth0", names.namespace(node))):
            _tc(space, "qdisc", "replace", "dev", link, "root", "tbf", "rate", f"{bits}bit",
                "burst", str(burst), "latency", "100ms")  # fmt: skip
        said.append(f"link at {rate} both ways")
    if share is not None:
        moved = _quota(names, node, share)
        said.append(f"CPU at {share}% of one CPU for its {moved} process(es) and their children")
    return f"{node}: {'; '.join(said)}; `clustertrain cluster heal {node}` undoes it"


def heal(state_dir: Path, node: str) -> str:
    """Undo ``degrade`` on ``node`` (what is not there is fine)."""
    heal_names(node_names(state_dir, node), [node])
    return f"{node}: healed (no queue discipline, no CPU quota)"


def heal_names(names: netns.Names, nodes: list[str]) -> None:
    """Remove the tbf queues and CPU quotas of ``nodes``; what is missing is fine."""
    for node in nodes:
        for link, space in ((names.host_link(node), None), ("eth0", names.namespace(node))):
            _tc(space, "qdisc", "del", "dev", link, "root", check=False)
        group = _group(names, node)
        if group.exists():
            _empty(group)


def _empty(group: Path) -> None:
    """Move every process of ``group`` back to its parent, then remove it. A member may fork
    while it is moved, and its child is born in the group: move again until none is left."""
    parent = group.parent / "cgroup.procs"
    for _ in range(100):
        for pid in _members(group):
            with contextlib.suppress(OSError):  # it ended meanwhile
                parent.write_text(f"{pid}\n")
        try:
            group.rmdir()
            return
        except OSError:  # EBUSY: a process was born in it meanwhile
            time.sleep(0.05)
    raise UserError(f"heal: {group} keeps getting new processes; run heal again")


def leftovers(names: netns.Names, nodes: list[str]) -> list[str]:
    """What of ``degrade`` is still in place on ``nodes``: `down` checks there is nothing."""
    found = []
    for node in nodes:
        shown = _tc(None, "qdisc", "show", "dev", names.host_link(node), check=False)
        if " tbf " in shown:
            found.append(f"tbf on {names.host_link(node)}")
        if _group(names, node).exists():
            found.append(f"cgroup {_group(names, node)}")
    return found


def _quota(names: netns.Names, node: str, share: int) -> int:
    """A cpu cgroup for ``node`` with ``share`` % of one CPU, every process of its namespace in
    it (twice: a process forked meanwhile by one not yet moved is caught the second time)."""
    group = _group(names, node)
    group.mkdir(exist_ok=True)
    quota = PERIOD_US * share // 100
    if (group / "cpu.cfs_quota_us").exists():
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    for _ in range(2):
        for pid in netns.processes(names).get(node, []):
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(f"{pid}\n")
    return len(_members(group))


def _group(names: netns.Names, node: str) -> Path:
    root = CGROUP_V1 if (CGROUP_V1 / "cpu.cfs_period_us").exists() else CGROUP_V2
    return root / f"{names.namespace(node)}-slow"


def _members(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _tc(space: str | None, *args: str, check: bool = True) -> str:
    argv = ["tc", *(["-n", space] if space else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"degrade: `{' '.join(argv)}` failed: {detail}")
    return done.stdout

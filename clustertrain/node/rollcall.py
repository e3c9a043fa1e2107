"""The batch script's roll call, for jobs with spare nodes: which of the step's nodes are gone.

A lost node does not end a step by itself: its peers fail or wait in a collective, and srun
waits for Slurm's verdict on the node (SlurmdTimeout: 300 s by default, more at some sites).
So every node of the step touches a beacon (protocol.BEACON_PREFIX + its name) each second while
its launcher runs, and the watchdog (clustertrain.node.watchdog) calls :func:`silent` as it polls. A
quiet beacon is only a suspicion, since a node whose launcher ended stops beating too; the roll
call decides, for each quiet node at once. First its slurmd, at the address and port Slurm has
for it (``scontrol show node``), is asked for a TCP connection: one accepted says the node is
there; one refused, or a host the kernel says is unreachable, says it is lost (a killed node's
slurmd refuses at once, where srun would try for about 6 s). When that cannot say (no answer
within ``CONNECT_S``: a link cut; or Slurm gave no address), one overlapping ``srun true`` on
the node decides, and a node whose srun fails or does not return within ``ANSWER_S`` is lost.
Slurm's own ping does the same, a few minutes later.

:func:`replace` is the arithmetic afterwards: the nodes to train on next and the spares left.
The supervisor (clustertrain.node.supervisor) calls the roll of the spares first (they have run
nothing yet), and shrinks the job to the nodes it keeps (``scontrol update JobId NodeList``): a
job that still holds a lost node stays COMPLETING after its end until Slurm declares it down.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clustertrain import protocol

# A beacon older than this is a suspicion. Its slurmd gets CONNECT_S to accept a connection;
# when it neither accepts nor refuses, srun gets ANSWER_S (a cut link takes srun's
# MessageTimeout, 10 s by default, which the timeout cuts short).
QUIET_S = 2.0 * protocol.BEACON_S
CONNECT_S = 1.0
ANSWER_S = 8.0
# After a roll call that found every node there, the next is not before this.
RECALL_S = 2.0
# What `scontrol show node` says of a node's slurmd, read as input: a host name or an address,
# and a port.
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


def silent(folder: Path, nodes: list[str], started: float) -> dict[str, float]:
    """The nodes whose beacon is older than QUIET_S, with when each was last heard from; a
    node that never beat counts from ``started`` (the step's start)."""
    now, quiet = time.time(), {}
    for node in nodes:
        try:
            heard = (folder / f"{protocol.BEACON_PREFIX}{node}").stat().st_mtime
        except OSError:
            heard = started
        if now - heard > QUIET_S:
            quiet[node] = heard
    return quiet


def call(nodes: list[str], answer_s: float = ANSWER_S) -> dict[str, str]:
    """Ask every node at once; the ones that did not answer, each with why."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        answers = dict(zip(nodes, pool.map(lambda node: _ask(node, answer_s), nodes), strict=True))
    return {node: why for node, why in answers.items() if why is not None}


def _ask(node: str, answer_s: float) -> str | None:
    """None when ``node`` is there; else why it is lost: its slurmd's answer to a connection,
    or where that says nothing, srun's."""
    where = slurmd_address(node)
    if where is not None:
        answer = knock(*where)
        if answer != "silent":
            return answer or None
    return _srun(node, answer_s)


def slurmd_address(node: str) -> tuple[str, int] | None:
    """The address and port of ``node``'s slurmd as Slurm has them; None when it does not say
    (or says something that is not an address and a port)."""
    try:
        done = subprocess.run(["scontrol", "show", "node", "--oneliner", node],
                              capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    said = dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)
    host, port = said.get("NodeAddr", ""), said.get("Port", "")
    if not (_HOST.fullmatch(host) or _is_address(host)) or not port.isdigit():
        return None
    return (host, int(port)) if 0 < int(port) < 65536 else None


def knock(host: str, port: int, timeout_s: float = CONNECT_S) -> str:
    """``""`` when a slurmd at ``host:port`` accepts a connection; why it is lost when it is
    refused or the host is unreachable; ``"silent"`` when neither comes in ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except ConnectionRefusedError:
        return f"its slurmd ({host}:{port}) refused the connection"
    except TimeoutError:
        return "silent"
    except OSError as exc:
        if exc.errno in _UNREACHABLE:
            return f"its slurmd ({host}:{port}) is unreachable ({exc.strerror})"
        return "silent"


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _srun(node: str, answer_s: float) -> str | None:
    """None when ``node`` ran a task of this job; else what srun said."""
    argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=answer_s)
    except subprocess.TimeoutExpired:
        return f"no answer in {answer_s:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    said = next((line for line in lines if "failure" in line or "error" in line), None)
    return (said or f"srun exited {done.returncode}").removeprefix("srun: error: ")


def replace(active: list[str], spares: list[str], lost: list[str]) -> tuple[list[str], list[str]]:
    """The step's next nodes (those kept, then the spares that replace the lost ones, in the
    spares' order) and the spares left. Raises LookupError when too few spares are left."""
    kept = [node for node in active if node not in lost]
    usable = [node for node in spares if node not in lost]
    needed = len(active) - len(kept)
    if needed > len(usable):
        raise LookupError(f"{needed} node(s) lost and {len(usable)} spare(s) left")
    return kept + usable[:needed], usable[needed:]

"""The probes without torch, on nodes without a GPU: numpy's matmul, plain TCP sockets' links.

Each node's probe process (the node check's, one a node) runs a :class:`Member`; the head
node's (node rank 0) also runs a :class:`Head` in a thread, listening on the rendezvous port
(as the torch probes' TCPStore did; the port was found free just before, and the head closes
it once every node has joined, long before torchrun's rendezvous binds it). What happens:

1. **join**: each member connects to the head, listens on an ephemeral port of the address
   that connection left from (the interface on its route to the head: the node check's
   ``interface``) and says hello: its node rank, that port, its kernel's boot id. The head
   welcomes each, or says why not (a rank twice, a field out of range). After ``join_s`` the
   head goes on with the nodes that came: one that did not fails its own probe ("joining the
   others: ..."), as with the torch probes.
2. **compute**: the head orders each node's matmul, in the waves of
   :func:`clustertrain.node.qualify.waves`: nodes with the same boot id share a kernel and so
   its cores (this project's local cluster: namespaces on one 2-core host) and take turns;
   nodes on different hosts run at once.
3. **links**: for each round of :func:`clustertrain.node.qualify.pairs`, the head tells the
   higher rank of a pair to serve and the lower to lead, with a one-time token: the leader
   connects to the server's port, they exchange one small message (not counted), then
   ``PAYLOAD`` bytes each way at least ``MIN_EXCHANGES`` times and up to ``EXCHANGES`` while
   the pair has spent under ``PAIR_BUDGET_S``. The leader times each exchange and tells the
   server its figure and whether another follows. Pairs of a round run at once, except those
   that share a host (the waves again). A node's figure is its best exchange's MiB/s; a node
   whose pairs all failed fails the link probe with the reason.
4. **end**: the head says so; each member closes first (its ephemeral port, not the
   rendezvous port, keeps the TIME_WAIT).

Messages are :mod:`clustertrain.node.wire`'s: length-prefixed JSON, capped, each read with a
deadline. Each node writes its own figures to the node check's folder (nodecheck), as the
torch probes do.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from clustertrain.node import torchprobe, wire
from clustertrain.node.qualify import (
    EXCHANGES,
    JOIN_S,
    MATMUL_N,
    MATMUL_REPEAT,
    MIN_EXCHANGES,
    PAIR_BUDGET_S,
    PAYLOAD,
    pairs,
    waves,
)
from clustertrain.node.wire import Deadline, WireError

# BLAS libraries read their thread count once, when they load: set before numpy is imported.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# A hello is sent right after the connection: a peer silent for this long is not a node's probe.
HELLO_S = 5.0
_HEX, _BOOT, _IPV4 = "0123456789abcdef", "0123456789abcdef-", "0123456789."

Compute = Callable[[], tuple[float, str]]


def cpu_compute() -> tuple[float, str]:
    """GFLOP/s of the fixed matmul on one CPU thread and what ran it: numpy, or torch (the
    torch probes' matmul) where numpy is missing."""
    fresh = "numpy" not in sys.modules
    if fresh:
        os.environ.update(dict.fromkeys(THREAD_VARS, "1"))
    try:
        import numpy as np  # lazy: only a qualifying node check needs it
    except ImportError:
        import torch  # lazy: as numpy; neither importable fails the probe

        return torchprobe.compute(torch), "torch"
    a = np.ones((MATMUL_N, MATMUL_N), dtype=np.float32)
    b, out = a.copy(), np.empty_like(a)
    with _one_thread(fresh):
        np.matmul(a, b, out=out)  # warm-up: BLAS's buffers
        started = time.perf_counter()
        for _ in range(MATMUL_REPEAT):
            np.matmul(a, b, out=out)
        seconds = time.perf_counter() - started
    return 2 * MATMUL_N**3 * MATMUL_REPEAT / seconds / 1e9, "numpy"


@contextlib.contextmanager
def _one_thread(fresh: bool) -> Iterator[None]:
    """One BLAS thread: the environment did it where numpy loaded just now; else threadpoolctl
    where it is installed (else BLAS's own count stands)."""
    try:
        from threadpoolctl import threadpool_limits  # lazy: optional
    except ImportError:
        fresh = True
    if fresh:
        yield
        return
    with threadpool_limits(limits=1):
        yield


def boot_id() -> str | None:
    """This kernel's boot id: the same for every node (container, namespace) it runs."""
    try:
        with open(BOOT_ID, "rb") as file:
            found = file.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return found if found and not found.strip(_BOOT) else None


def measure(
    address: str, port: int, rank: int, world: int, join_s: float = JOIN_S,
    compute: Compute = cpu_compute,
) -> dict[str, Any]:  # fmt: skip
    """This node's figures (``gflops``, ``link_mib_s``), or ``qualify_error``. ``address``:
    the head node's; on node rank 0, the head listens on ``port`` in a thread."""
    head = None
    if rank == 0:
        try:
            listener = socket.create_server(("", port), backlog=max(world, 16))
        except OSError as exc:
            return {"qualify_error": f"rendezvous port {port}: {exc.strerror or exc}"}
        head = threading.Thread(
            target=Head(listener, world, join_s).run, name="qualify-head", daemon=True
        )
        head.start()
    try:
        return Member(address, port, rank, join_s, compute).run()
    finally:
        if head is not None:
            head.join()  # every wait of the head's is bounded by join_s


@dataclass
class _Node:
    rank: int
    sock: socket.socket
    address: str  # as the head sees it: the node's end of its connection
    port: int
    boot: str | None


class Head:
    """The head node's side: who joined, then the orders, wave by wave."""

    def __init__(self, listener: socket.socket, world: int, join_s: float) -> None:
        self.listener, self.world, self.join_s = listener, world, join_s
        self.nodes: dict[int, _Node] = {}

    def run(self) -> None:
        try:
            self._join()
            ranks = sorted(self.nodes)
            for wave in waves([[self.nodes[r].boot] for r in ranks]):
                self._orders([(ranks[i], {"do": "compute"}) for i in wave])
            for round_ in pairs(len(ranks)):
                self._round([(ranks[a], ranks[b]) for a, b in round_])
            self._orders([(rank, {"do": "end"}) for rank in self.nodes], replies=False)
            deadline = Deadline(self.join_s)
            for node in self.nodes.values():  # the member closes first
                with contextlib.suppress(WireError, OSError):
                    wire.read_exactly(node.sock, 1, deadline)
        finally:
            self.listener.close()
            for node in self.nodes.values():
                node.sock.close()

    def _join(self) -> None:
        """Hellos until every node's, or ``join_s``; then the port is closed."""
        deadline = Deadline(self.join_s)
        with self.listener:
            while len(self.nodes) < self.world:
                try:
                    self.listener.settimeout(deadline.left())
                    conn, peer = self.listener.accept()
                except (WireError, OSError):
                    return
                node = self._hello(conn, peer[0], deadline.within(HELLO_S))
                if node is not None:
                    self.nodes[node.rank] = node

    def _hello(self, conn: socket.socket, address: str, deadline: Deadline) -> _Node | None:
        try:
            hello = wire.receive(conn, deadline)
            rank = wire.integer(hello, "rank", 0, self.world - 1)
            boot = wire.text(hello, "boot", _BOOT, 64) if "boot" in hello else None
            node = _Node(rank, conn, address, wire.integer(hello, "port", 1, 65535), boot)
            if rank in self.nodes:
                raise WireError(f"node rank {rank} joined twice")
            wire.send(conn, deadline, {"welcome": True})
            return node
        except (WireError, OSError) as exc:
            with contextlib.suppress(WireError, OSError):
                wire.send(conn, deadline, {"error": str(exc)})
            conn.close()
            return None

    def _round(self, round_: list[tuple[int, int]]) -> None:
        """A round of pairs, in waves: the higher rank serves, the lower leads."""
        round_ = [(a, b) for a, b in round_ if a in self.nodes and b in self.nodes]
        for wave in waves([[self.nodes[a].boot, self.nodes[b].boot] for a, b in round_]):
            orders: list[tuple[int, dict[str, Any]]] = []
            for low, high in (round_[i] for i in wave):
                if low in self.nodes and high in self.nodes:  # neither dropped in a wave before
                    token, server = secrets.token_hex(16), self.nodes[high]
                    orders += [(high, {"do": "serve", "peer": low, "token": token}),
                               (low, {"do": "lead", "peer": high, "address": server.address,
                                      "port": server.port, "token": token})]  # fmt: skip
            self._orders(orders)

    def _orders(self, orders: list[tuple[int, dict[str, Any]]], replies: bool = True) -> None:
        """Each order sent, then each reply awaited (``join_s`` in all); a node that does not
        answer is dropped: its own probe says why."""
        deadline = Deadline(self.join_s)
        for rank, order in orders:
            if rank in self.nodes:
                try:
                    wire.send(self.nodes[rank].sock, deadline, order)
                except (WireError, OSError):
                    self.nodes.pop(rank).sock.close()
        for rank, _ in orders if replies else ():
            if rank in self.nodes:
                try:
                    if wire.receive(self.nodes[rank].sock, deadline).get("done") is not True:
                        raise WireError("a reply that is not done")
                except (WireError, OSError):
                    self.nodes.pop(rank).sock.close()


class Member:
    """One node's side: join, then carry out the head's orders until the end."""

    def __init__(self, address: str, port: int, rank: int, join_s: float, compute: Compute) -> None:
        self.head, self.rank, self.join_s, self.compute = (address, port), rank, join_s, compute
        self.gflops: float | None = None
        self.best: float | None = None
        self.pairs, self.failed, self.by, self.last = 0, "", "", ""

    def run(self) -> dict[str, Any]:
        try:
            ctrl, listener = self._join()
        except (WireError, OSError) as exc:
            return {"qualify_error": f"joining the others: {exc}"}
        with ctrl, listener:
            try:
                while self._order(ctrl, listener):
                    wire.send(ctrl, Deadline(self.join_s), {"done": True})
            except (WireError, OSError) as exc:
                return {"qualify_error": f"the head node: {exc}"}
            except Exception as exc:  # noqa: BLE001 - a failed probe is a verdict, in one line
                return {"qualify_error": f"compute probe: {type(exc).__name__}: {exc}"[:240]}
        if self.gflops is None:
            return {"qualify_error": "the head node ended before this node's matmul"}
        if self.pairs and self.best is None:
            return {"qualify_error": f"link probe: {self.failed}"}
        return {"gflops": self.gflops, "link_mib_s": self.best, "probes": f"{self.by}+sockets"}

    def _join(self) -> tuple[socket.socket, socket.socket]:
        """Connected, listening and welcomed; the head not there yet, or closing on a slow
        hello: again, until ``join_s``."""
        deadline = Deadline(self.join_s)
        while (joined := self._attempt(deadline)) is None:
            if deadline.at - time.monotonic() < 0.1:
                host, port = self.head
                raise WireError(f"no welcome from the head node at {host}:{port} within "
                                f"{self.join_s:g} s (last: {self.last})")  # fmt: skip
            time.sleep(0.1)
        return joined

    def _attempt(self, deadline: Deadline) -> tuple[socket.socket, socket.socket] | None:
        """One try at joining; None to try again (why in ``last``); a refusal, raised."""
        try:
            ctrl = socket.create_connection(self.head, timeout=deadline.left())
        except (WireError, OSError) as exc:
            self.last = str(exc) or type(exc).__name__
            return None
        listener = None
        try:
            listener = socket.create_server((ctrl.getsockname()[0], 0))
            hello = {"rank": self.rank, "port": listener.getsockname()[1]}
            wire.send(ctrl, deadline, hello | ({"boot": boot} if (boot := boot_id()) else {}))
            answer = wire.receive(ctrl, deadline)
        except (WireError, OSError) as exc:
            self.last = str(exc) or type(exc).__name__
            answer = {}
        if answer.get("welcome") is True and listener is not None:
            return ctrl, listener
        ctrl.close()
        if listener is not None:
            listener.close()
        if "error" in answer:
            raise WireError(f"the head node refused this node: {str(answer['error'])[:200]}")
        return None

    def _order(self, ctrl: socket.socket, listener: socket.socket) -> bool:
        """The head's next order carried out; False at the end. The first may wait out the
        head's join window, any may wait out a wave of others' steps: ``join_s`` each."""
        order = wire.receive(ctrl, Deadline(2 * self.join_s))
        do = order.get("do")
        if do == "end":
            return False
        if do == "compute":
            self.gflops, self.by = self.compute()
            return True
        if do not in ("lead", "serve"):
            raise WireError("an order that is none of compute, lead, serve, end")
        peer, token = wire.integer(order, "peer", 0, 1 << 20), wire.text(order, "token", _HEX, 64)
        self.pairs += 1
        try:
            if do == "lead":
                address = str(ipaddress.IPv4Address(wire.text(order, "address", _IPV4, 15)))
                port = wire.integer(order, "port", 1, 65535)
                speed = lead((address, port), token, Deadline(self.join_s / 2))
            else:
                speed = serve(listener, token, Deadline(self.join_s / 2))
        except (WireError, OSError, ValueError) as exc:
            self.failed = f"with node rank {peer}: {exc or type(exc).__name__}"
            return True
        self.best = speed if self.best is None else max(self.best, speed)
        return True


def lead(server: tuple[str, int], token: str, deadline: Deadline) -> float:
    """The lower rank's side of a pair: the best MiB/s of its exchanges, each timed here."""
    payload, best = bytes(PAYLOAD), 0.0
    with socket.create_connection(server, timeout=deadline.left()) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.send(sock, deadline, {"token": token})
        wire.receive(sock, deadline)  # not counted: a first message waits for what one waits for
        started = time.perf_counter()
        for count in range(1, EXCHANGES + 1):
            begun = time.perf_counter()
            sock.settimeout(deadline.left())
            sock.sendall(payload)
            wire.read_exactly(sock, PAYLOAD, deadline)
            speed = 2 * PAYLOAD / (1 << 20) / (time.perf_counter() - begun)
            best = max(best, speed)
            spent = time.perf_counter() - started
            more = count < MIN_EXCHANGES or (count < EXCHANGES and spent < PAIR_BUDGET_S)
            wire.send(sock, deadline, {"mib_s": speed, "more": more})
            if not more:
                break
    return best


def serve(listener: socket.socket, token: str, deadline: Deadline) -> float:
    """The higher rank's side: the leader's connection (another's, or a wrong token, is closed
    and the next awaited), its payloads sent back, the best of the figures it reports."""
    while True:
        listener.settimeout(deadline.left())
        conn, _ = listener.accept()
        with conn:
            try:
                if wire.receive(conn, deadline).get("token") != token:
                    continue
            except (WireError, OSError):
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.send(conn, deadline, {"ok": True})
            return _answer(conn, deadline)


def _answer(conn: socket.socket, deadline: Deadline) -> float:
    best = 0.0
    for _ in range(EXCHANGES):
        data = wire.read_exactly(conn, PAYLOAD, deadline)
        conn.settimeout(deadline.left())
        conn.sendall(data)
        report = wire.receive(conn, deadline)
        best = max(best, wire.positive(report, "mib_s"))
        if report.get("more") is not True:
            break
    return best

"""The probes without torch (clustertrain.node.sockprobe) between real sockets on 127.0.0.1:
nodes are threads of this process, each with its own Member, rank 0 with the Head too.
Hostile peers (a message over the cap, garbage, silence) fail cleanly; every wait is bounded,
and the tests that wait set the bounds small. No timed assert: figures are only positive."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Any

import pytest

from clustertrain.node import sockprobe, wire
from clustertrain.node.wire import Deadline, WireError


def _stub() -> tuple[float, str]:
    return 42.0, "stub"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measured(
    ranks: list[int], world: int, join_s: float = 10.0, port: int = 0
) -> dict[int, dict[str, Any]]:
    """Each rank's :func:`sockprobe.measure`, each in a thread."""
    port, found = port or _free_port(), dict[int, dict[str, Any]]()

    def one(rank: int) -> None:
        found[rank] = sockprobe.measure("127.0.0.1", port, rank, world, join_s, _stub)

    threads = [threading.Thread(target=one, args=(rank,), daemon=True) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10 * join_s)
    return found


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_node_gets_its_figures_from_a_real_exchange(world: int) -> None:
    found = _measured(list(range(world)), world)
    assert sorted(found) == list(range(world))
    for figures in found.values():
        assert figures["gflops"] == 42.0 and figures["probes"] == "stub+sockets"
        assert figures["link_mib_s"] > 0
    if world == 2:  # one pair: the leader's timing is both nodes' figure
        assert found[0]["link_mib_s"] == found[1]["link_mib_s"]


def test_the_rendezvous_port_is_free_again_for_torchrun_when_the_probes_end() -> None:
    port = _free_port()
    assert all(f["link_mib_s"] > 0 for f in _measured([0, 1, 2], 3, port=port).values())
    with socket.create_server(("", port)):  # as the TCPStore of torchrun's rendezvous binds it
        pass


def test_one_node_alone_has_a_matmul_and_no_link() -> None:
    assert _measured([0], 1) == {0: {"gflops": 42.0, "link_mib_s": None, "probes": "stub+sockets"}}


def test_a_node_that_never_comes_leaves_the_others_measured_after_the_join_timeout() -> None:
    found = _measured([0, 1], world=3, join_s=2.0)
    assert found[0]["link_mib_s"] > 0 and found[1]["link_mib_s"] > 0


def test_a_node_whose_head_never_answers_fails_its_probe_with_the_reason() -> None:
    found = sockprobe.measure("127.0.0.1", _free_port(), 1, 2, 0.5, _stub)
    assert found["qualify_error"].startswith("joining the others: no welcome from the head node")


def _say(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!I", len(data)) + data)


def _hostile(port: int, kind: str) -> socket.socket:
    """A stranger on the head's port, once it listens, saying what no member says."""
    for _ in range(200):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            break
        except ConnectionRefusedError:
            threading.Event().wait(0.05)
    said = {
        "oversized": struct.pack("!I", 1 << 30),
        "garbage": struct.pack("!I", 9) + b"{not json",
        "deep": struct.pack("!I", 4000) + b"[" * 4000,
        "rank out of range": struct.pack("!I", 22) + b'{"rank": 7, "port": 1}',
        "bad port": struct.pack("!I", 25) + b'{"rank": 1, "port": "-x"}',
        "silent": b"",
    }
    sock.sendall(said[kind])
    return sock


def _answer(sock: socket.socket) -> bytes:
    """What ``sock`` is told until it is closed on."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "kind", ["oversized", "garbage", "deep", "rank out of range", "bad port", "silent"]
)
def test_a_hostile_peer_on_the_rendezvous_port_is_turned_away_and_the_nodes_go_on(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(sockprobe, "HELLO_S", 0.3)
    port, found = _free_port(), dict[int, dict[str, Any]]()
    head = threading.Thread(
        target=lambda: found.update({0: sockprobe.measure("127.0.0.1", port, 0, 2, 5.0, _stub)})
    )
    head.start()
    with _hostile(port, kind) as stranger:
        answer = _answer(stranger)
    assert (b'"error"' in answer) == (kind != "silent")
    found[1] = sockprobe.measure("127.0.0.1", port, 1, 2, 5.0, _stub)
    head.join(timeout=20)
    assert found[0]["link_mib_s"] > 0 and found[1]["link_mib_s"] > 0


def _fake_head(answer: dict[str, Any], *said: bytes) -> tuple[int, threading.Thread]:
    """A head that answers one member's hello with ``answer``, then says ``said``, then waits
    for it to go."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                wire.receive(conn, Deadline(5))
                wire.send(conn, Deadline(5), answer)
                for data in said:
                    conn.sendall(data)
                conn.settimeout(5)
                while conn.recv(4096):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return int(server.getsockname()[1]), thread


@pytest.mark.parametrize(
    ("said", "why"),
    [
        ([struct.pack("!I", 1 << 20)], "over 4096"),
        ([struct.pack("!I", 3) + b"[1]"], "not a JSON object"),
        ([struct.pack("!I", 27) + b'{"do": "--rm", "x": "/etc"}'], "none of compute"),
        ([], "timed out"),
    ],
)
def test_a_head_that_says_what_no_head_says_fails_the_node_in_one_line(
    said: list[bytes], why: str
) -> None:
    port, thread = _fake_head({"welcome": True}, *said)
    found = sockprobe.measure("127.0.0.1", port, 1, 2, 0.5, _stub)
    assert found["qualify_error"].startswith("the head node: ") and why in found["qualify_error"]
    thread.join(timeout=10)


def test_a_head_that_refuses_a_node_says_why_and_the_node_does_not_retry() -> None:
    port, thread = _fake_head({"error": "node rank 1 joined twice"})
    found = sockprobe.measure("127.0.0.1", port, 1, 2, 5.0, _stub)
    assert found["qualify_error"] == (
        "joining the others: the head node refused this node: node rank 1 joined twice"
    )
    thread.join(timeout=10)


def test_a_pair_server_closes_strangers_and_waits_for_its_leader() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    address = ("127.0.0.1", int(listener.getsockname()[1]))
    speeds: list[float] = []
    server = threading.Thread(
        target=lambda: speeds.append(sockprobe.serve(listener, "ab" * 16, Deadline(10)))
    )
    server.start()
    with socket.create_connection(address) as stranger:
        _say(stranger, b"garbage")
    with socket.create_connection(address) as wrong:
        wire.send(wrong, Deadline(5), {"token": "cd" * 16})
        assert wrong.recv(1) == b""  # closed on it
    lead = sockprobe.lead(address, "ab" * 16, Deadline(10))
    server.join(timeout=10)
    listener.close()
    assert lead > 0 and speeds == [lead]


def test_a_pair_server_whose_leader_never_comes_gives_up_at_its_deadline() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    silent = socket.create_connection(listener.getsockname())  # connects, says nothing
    with listener, silent, pytest.raises((WireError, OSError)):
        sockprobe.serve(listener, "ab" * 16, Deadline(0.3))


def test_wire_reads_only_what_it_announced_and_refuses_the_rest() -> None:
    left, right = socket.socketpair()
    with left, right:
        wire.send(left, Deadline(1), {"rank": 3})
        assert wire.receive(right, Deadline(1)) == {"rank": 3}
        for data, why in [(b"\xff\xfe", "not JSON"), (b"7", "not a JSON object")]:
            _say(left, data)
            with pytest.raises(WireError, match=why):
                wire.receive(right, Deadline(1))
        with pytest.raises(WireError, match="over 4096"):
            wire.send(left, Deadline(1), {"x": "y" * 5000})
        with pytest.raises(WireError, match="timed out"):
            wire.receive(right, Deadline(0.05))
        left.close()
        with pytest.raises(WireError, match="closed"):
            wire.receive(right, Deadline(1))


@pytest.mark.parametrize(
    ("message", "ok"),
    [({"n": 3}, True), ({"n": True}, False), ({"n": 3.0}, False), ({"n": 99}, False), ({}, False)],
)
def test_wire_fields_are_typed_and_bounded(message: dict[str, Any], ok: bool) -> None:
    if ok:
        assert wire.integer(message, "n", 0, 10) == 3
    else:
        with pytest.raises(WireError):
            wire.integer(message, "n", 0, 10)
    for bad in ({"f": float("nan")}, {"f": -1}, {"f": "1"}, {"f": True}):
        with pytest.raises(WireError):
            wire.positive(bad, "f")
    with pytest.raises(WireError):
        wire.text({"t": "12ab/.."}, "t", "0123456789abcdef", 64)


def test_the_numpy_matmul_reads_positive_gflops_on_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("numpy")
    for name in sockprobe.THREAD_VARS:  # restored after: the call may set them
        monkeypatch.setenv(name, "1")
    gflops, by = sockprobe.cpu_compute()
    assert gflops > 0 and by == "numpy"


def test_the_boot_id_is_read_and_checked() -> None:
    found = sockprobe.boot_id()
    assert found is None or (len(found) <= 64 and not found.strip("0123456789abcdef-"))

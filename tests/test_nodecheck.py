"""The in-job node check: each problem is one line naming the node."""

from __future__ import annotations

import socket

from clustertrain.nodecheck import probe, verdict


def _probe(node: str, address: str, host: str | None = None) -> dict[str, str]:
    return {"node": node, "host": host or node, "head": "node1", "address": address}


def test_all_well() -> None:
    assert verdict([_probe("node1", "10.0.0.1"), _probe("node2", "10.0.0.1")], 2) is None
    # One host running every node (the local test cluster): loopback is right there.
    same_host = [_probe("node1", "127.0.0.1", "vm"), _probe("node2", "127.0.0.1", "vm")]
    assert verdict(same_host, 2) is None


def test_problems_name_the_node() -> None:
    differ = verdict([_probe("node1", "10.0.0.1"), _probe("node2", "10.0.9.9")], 2)
    assert differ is not None and "node2=10.0.9.9" in differ
    loop = verdict([_probe("node1", "127.0.1.1"), _probe("node2", "127.0.1.1")], 2)
    assert loop is not None and "loopback" in loop
    missing = verdict([_probe("node1", "10.0.0.1")], 2)
    assert missing is not None and "only 1 of 2" in missing
    failed = verdict([{**_probe("node2", ""), "error": "cannot resolve node1: Name unknown"}], 1)
    assert failed == "node2: cannot resolve node1: Name unknown"


def test_probe_sees_a_taken_port_and_an_unknown_head() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert "in use" in probe("localhost", port, is_head=True)["error"]
    assert "cannot resolve" in probe("no-such-host.invalid", 29500, is_head=False)["error"]
    assert probe("localhost", 29500, is_head=False)["address"] == "127.0.0.1"

"""The in-job node check: each problem is one line naming the node."""

from __future__ import annotations

import socket

from clustertrain.node.netif import interface_to
from clustertrain.node.nodecheck import probe, summary, verdict


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


def test_the_odd_node_out_is_named() -> None:
    probes = [_probe("node1", "10.0.0.1"), _probe("node2", "10.0.9.9"), _probe("node3", "10.0.0.1")]
    assert verdict(probes, 3) == (
        "node2=10.0.9.9: resolves the head node node1 unlike the others (10.0.0.1); fix DNS"
    )
    # Debian's "127.0.1.1 node1" line on the head node itself, across separate hosts.
    probes[0] = _probe("node1", "127.0.1.1")
    problem = verdict(probes, 3)
    assert problem is not None and problem.startswith("node1: resolves the head node node1 to the")
    assert "loopback address 127.0.1.1" in problem


def test_a_head_node_that_names_an_address_not_its_own_is_refused() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never a local address, and nothing is sent to it.
    found = probe("192.0.2.77", 29500, is_head=True)
    assert "which is not one of its addresses" in found["error"]


def test_the_interface_to_the_head_is_the_one_holding_the_route() -> None:
    assert interface_to("127.0.0.1") == "lo"
    assert probe("localhost", 29500, is_head=False)["interface"] == "lo"
    line = summary([{**_probe("node1", "10.0.0.1"), "interface": "eth0"}], 1.25)
    assert line == (
        "node check passed on 1 node(s) in 1.2 s: head node node1 is 10.0.0.1; "
        "interface to it: node1=eth0"
    )

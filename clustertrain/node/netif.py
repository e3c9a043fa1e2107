"""The network interface a node trains over: the one on its route to the head node.

``python -m clustertrain.node.netif HEAD`` prints it; each node's launch script gives it to gloo and
NCCL (``protocol.SOCKET_IFNAME_VARS``), and the node check shows it. On a node with several
interfaces (a management network, InfiniBand, a container bridge) their own guesses can pick
one the other nodes cannot reach.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import sys

_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B  # netdevice(7)


def _ipv4(sock: socket.socket, request: int, name: str) -> str | None:
    try:
        packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name[:15].encode()))
    except OSError:
        return None
    return socket.inet_ntoa(packed[20:24])


def interface_to(address: str) -> str | None:
    """This host's interface on the route to ``address`` (the head node's own: its address's).

    A UDP connect only asks the kernel for the route and its source address: nothing is sent.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((address, 9))
        except OSError:
            return None
        source = ipaddress.IPv4Address(sock.getsockname()[0])
        for _, name in socket.if_nameindex():
            own, mask = _ipv4(sock, _SIOCGIFADDR, name), _ipv4(sock, _SIOCGIFNETMASK, name)
            if own and mask and source in ipaddress.IPv4Network(f"{own}/{mask}", strict=False):
                return name
    return None


def main(argv: list[str]) -> int:
    try:
        name = interface_to(socket.gethostbyname(argv[0]))
    except OSError:
        name = None
    if name:
        print(name)
    return 0 if name else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

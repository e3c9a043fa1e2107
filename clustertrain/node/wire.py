"""Messages between the nodes' probes (clustertrain.node.sockprobe): bounded, typed, timed.

A message is a 4-byte big-endian length, then that many bytes of one JSON object, at most
``MAX_MESSAGE``. Every read waits until a :class:`Deadline` at most and reads what it
announced, no more; what is not a message, or is over the cap, is a :class:`WireError`, as is
a field of the wrong type or range. Anything may connect to a listening port: a value read
from a socket is input, compared and counted, never a path, an option or a command.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
from typing import Any

from clustertrain.files import RunFolderError, parse_json

# The largest message the probes send is a few hundred bytes (an address, a port, a token).
MAX_MESSAGE = 4096
_LENGTH = struct.Struct("!I")


class WireError(Exception):
    """A peer that sent no message, a wrong one, or none in time; its text says which."""


class Deadline:
    """A point in time every wait of one step ends by."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; past the deadline, a :class:`WireError`."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise WireError("timed out")
        return left

    def within(self, seconds: float) -> Deadline:
        """The sooner of this deadline and ``seconds`` from now."""
        sooner = Deadline(seconds)
        sooner.at = min(sooner.at, self.at)
        return sooner


def send(sock: socket.socket, deadline: Deadline, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise WireError(f"a message of {len(data)} bytes, over {MAX_MESSAGE}")
    sock.settimeout(deadline.left())
    sock.sendall(_LENGTH.pack(len(data)) + data)


def receive(sock: socket.socket, deadline: Deadline) -> dict[str, Any]:
    """One message: a JSON object of at most MAX_MESSAGE bytes."""
    (length,) = _LENGTH.unpack(read_exactly(sock, _LENGTH.size, deadline))
    if length > MAX_MESSAGE:
        raise WireError(f"a message of {length} bytes announced, over {MAX_MESSAGE}")
    try:
        message = parse_json(bytes(read_exactly(sock, length, deadline)), "a message")
    except RunFolderError:
        raise WireError("a message that is not JSON") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message


def read_exactly(sock: socket.socket, count: int, deadline: Deadline) -> bytearray:
    """``count`` bytes, as they come, until the deadline; the peer closing first is an error."""
    buffer = bytearray(count)
    view, got = memoryview(buffer), 0
    while got < count:
        sock.settimeout(deadline.left())
        try:
            chunk = sock.recv_into(view[got:], count - got)
        except TimeoutError:
            raise WireError("timed out") from None
        if chunk == 0:
            raise WireError("the peer closed the connection")
        got += chunk
    return buffer


def integer(message: dict[str, Any], key: str, low: int, high: int) -> int:
    """``message[key]``, an integer from ``low`` to ``high``."""
    value = message.get(key)
    if type(value) is not int or not low <= value <= high:
        raise WireError(f"{key}: not an integer from {low} to {high}")
    return value


def positive(message: dict[str, Any], key: str) -> float:
    """``message[key]``, a finite number above zero."""
    value = message.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise WireError(f"{key}: not a number")
    if not math.isfinite(value) or value <= 0:
        raise WireError(f"{key}: not a positive number")
    return float(value)


def text(message: dict[str, Any], key: str, allowed: str, most: int) -> str:
    """``message[key]``, 1 to ``most`` characters each in ``allowed``."""
    value = message.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= most or value.strip(allowed):
        raise WireError(f"{key}: not 1 to {most} characters of {allowed!r}")
    return value

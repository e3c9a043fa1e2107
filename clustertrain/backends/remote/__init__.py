"""The remote backend: a login node's clustertrain over OpenSSH, every fact of it here.

ssh.py       the system's ssh client: the host checked, one master connection, words quoted
snapshot.py  the code a remote job runs: ``git archive`` sent once, content-addressed
request.py   the backend's request (the login node's command line) and queueing it
record.py    this side's record of such a run (``remote.json``), read back as input
stream.py    what the login node answers: forwarded commands, ``logs --follow``, fetched files
unpack.py    the one unpacker of the tars a login node sends back: checked whole, bounded
doctor.py    ``doctor --host``
backend.py   ``RemoteBackend``, the interface of ``clustertrain.backends.base``
"""

from __future__ import annotations

from .backend import RemoteBackend
from .record import REMOTE_RUNS, Remote, of
from .request import Request, queue
from .stream import FETCH_LIMIT, Streamed, fetch, forward

__all__ = [
    "FETCH_LIMIT",
    "REMOTE_RUNS",
    "Remote",
    "RemoteBackend",
    "Request",
    "Streamed",
    "fetch",
    "forward",
    "of",
    "queue",
]

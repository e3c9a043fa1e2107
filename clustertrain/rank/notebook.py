"""What every rank of a notebook's job runs, under the job's launcher: the function the notebook
sent (:func:`clustertrain.notebook_launcher`), called with its arguments; then rank 0's return
value, or each failing rank's error in a line, for the notebook to read back.

  python -m clustertrain.rank.notebook MAX_BYTES     (the run folder: $CLUSTERTRAIN_RUN_DIR)

The files, all in the run folder itself (:data:`clustertrain.protocol.NOTEBOOK_CALL` and the
two beside it):

- the call: ``{"fn", "args", "key"}``, pickled by cloudpickle, 0600. Unpickling it
  runs code, so it is read only as a file that this user alone can have written
  (:func:`clustertrain.files.read_own`): the notebook's user, who is the ranks' user.
- the result: rank 0's return value, pickled, then sealed: an HMAC-SHA256 under the call's
  ``key`` (32 random bytes the notebook made for this run; only the call, 0600, ever held it)
  goes before it. The notebook unpickles it only if the seal holds, so a result from another
  run, or a file put there by anyone who could not read this run's call, is refused unread.
- an error: ``{"rank", "node", "time", "error"}`` in JSON, one per failing rank; read as text.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import sys
import time
import traceback
from pathlib import Path

import cloudpickle

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import read_own, write_private
from clustertrain.rank import env, runtime

SEAL = b"clustertrain-notebook-result-1\n"
_MAC_BYTES = hashlib.sha256().digest_size
SEAL_BYTES = len(SEAL) + _MAC_BYTES  # what a seal adds to what it seals
# An error's line is a line: the rest of a long message is in the rank's log.
ERROR_CHARS = 500


def seal(key: bytes, data: bytes) -> bytes:
    """``data`` with the proof that a holder of ``key`` wrote it."""
    return SEAL + hmac.new(key, data, hashlib.sha256).digest() + data


def unseal(key: bytes, sealed: bytes) -> bytes | None:
    """What :func:`seal` sealed under ``key``; None for anything else."""
    head, start = len(SEAL), SEAL_BYTES
    if not sealed.startswith(SEAL) or len(sealed) < start:
        return None
    data = sealed[start:]
    good = hmac.new(key, data, hashlib.sha256).digest()
    return data if hmac.compare_digest(good, sealed[head:start]) else None


def error_line(exc: BaseException) -> str:
    """``ValueError: boom``: an exception's name and message (clustertrain's own, a
    :class:`UserError`, its message alone), in one line."""
    said = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
    said = " ".join(said.split())
    return said if len(said) <= ERROR_CHARS else said[: ERROR_CHARS - 3] + "..."


def _run(run_dir: Path, max_bytes: int, rank: int) -> None:
    call = pickle.loads(read_own(run_dir / protocol.NOTEBOOK_CALL, max_bytes))
    value = call["fn"](*call["args"])
    if rank != 0:
        return
    try:
        data = cloudpickle.dumps(value)
    except Exception as exc:
        raise UserError(
            f"the return value ({type(value).__name__}) cannot be pickled ({error_line(exc)}); "
            "return plain data, or save it under $CLUSTERTRAIN_OUT_DIR and return its path"
        ) from None
    if len(data) > max_bytes:
        raise UserError(
            f"the return value is {len(data)} bytes pickled, over max_bytes ({max_bytes}); "
            "return less, or save it under $CLUSTERTRAIN_OUT_DIR and "
            "return its path"
        )
    write_private(run_dir / protocol.NOTEBOOK_RESULT, seal(call["key"], data))


def main(argv: list[str]) -> int:
    """Run the call; 0 when it returned (and rank 0's value is written), else 1 with this
    rank's error written beside it and its traceback on stderr, as any rank's."""
    run_dir = Path(os.environ[protocol.ENV_RUN_DIR])
    rank = env.from_environ().rank
    try:
        _run(run_dir, int(argv[0]), rank)
    except BaseException as exc:  # a SystemExit or an interrupt ends the call unfinished too
        _print_traceback(exc)
        node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        record = {"rank": rank, "node": node, "time": time.time(), "error": error_line(exc)}
        error = run_dir / protocol.NOTEBOOK_ERROR.format(rank=rank)
        write_private(error, (json.dumps(record) + "\n").encode())
        return 1
    return 0


def _print_traceback(exc: BaseException) -> None:
    """The traceback of the user's own frames (this module's add nothing to it); an error of
    clustertrain's own, in a line."""
    if isinstance(exc, UserError):
        print(f"clustertrain: error: {exc}", file=sys.stderr, flush=True)
        return
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
        frames = frames.tb_next
    traceback.print_exception(type(exc), exc, frames)


def _end(code: int) -> None:
    """Leave the process group together if the call formed one (torch only then)."""
    if code == 0 and "torch.distributed" in sys.modules:
        runtime.finish(code)
    sys.exit(code)


if __name__ == "__main__":
    _end(main(sys.argv[1:]))

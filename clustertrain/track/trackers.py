"""The trackers by name, each made for a run from what the user gave (``--uri``,
``--logdir``). Each one's module imports its library (an extra: ``clustertrain[mlflow]``...),
and only when that tracker is asked for: ``import clustertrain`` stays as light as before."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from clustertrain.errors import UserError
from clustertrain.files import printable
from clustertrain.runs import Run
from clustertrain.spec.fields import TRACKERS
from clustertrain.track.base import Tracker

NAMES = TRACKERS  # one list: the job file's `track` field says the same names
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def check_uri(uri: str) -> str:
    """``uri`` if it is one (a scheme, then a host or a path: ``http://host:5000``,
    ``file:///srv/mlruns``, ``sqlite:///mlflow.db``), else a :class:`UserError` naming
    ``--uri``."""
    parts = urlsplit(uri) if uri.isprintable() and " " not in uri else None
    if parts is None or not _SCHEME.fullmatch(parts.scheme) or not (parts.netloc or parts.path):
        raise UserError(
            f"--uri: {printable(repr(uri))[:80]} is not a URI; give one like "
            "http://127.0.0.1:5000 or file:///srv/mlruns"
        )
    try:
        parts.port  # noqa: B018  (reading it checks it: a port out of range raises)
    except ValueError:
        raise UserError(f"--uri: {printable(repr(uri))[:80]} has no valid port") from None
    return uri


def make(
    name: str,
    run: Run,
    uri: str | None = None,
    logdir: str | None = None,
    say: Callable[[str], None] = print,
) -> Tracker:
    """Tracker ``name`` for ``run``: MLflow at ``uri`` (else $MLFLOW_TRACKING_URI), TensorBoard
    into ``logdir`` (else the run folder's ``tensorboard/``), W&B's offline runs synced to
    ``uri`` (else W&B's own default)."""
    if name not in NAMES:
        raise UserError(f"--to: {printable(repr(name))[:40]} is none of {', '.join(NAMES)}")
    if uri is not None:
        check_uri(uri)
    try:
        if name == "tensorboard":
            from clustertrain.track import tensorboard  # lazy: the tensorboard extra

            return tensorboard.TensorBoard(run, Path(logdir) if logdir else None)
        if name == "mlflow":
            found = uri or os.environ.get("MLFLOW_TRACKING_URI")
            if not found:
                raise UserError("--uri: no MLflow server named; give --uri or MLFLOW_TRACKING_URI")
            from clustertrain.track import mlflow  # lazy: the mlflow extra

            return mlflow.MLflow(run, check_uri(found))
    except ImportError as exc:
        raise UserError(
            f"--to {name}: needs {exc.name or name}: pip install 'clustertrain[{name}]'"
        ) from None
    from clustertrain.track import wandb  # lazy: only `wandb sync`, the command, is needed

    return wandb.WandB(run, uri, say)

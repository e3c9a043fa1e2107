"""Tracker relay: what a job's ranks recorded in its run folder, sent to TensorBoard, MLflow or
W&B from a machine that reaches them, while the job's nodes need no route out.

``base`` is the one interface (records in, tracker calls out), ``records`` the pure
translation, ``position`` what was sent (``track/<tracker>.json`` in the run folder),
``relay`` the loop, ``trackers`` the trackers by name; ``tensorboard``, ``mlflow`` and
``wandb`` one module each, imported only when asked for (their libraries are extras)."""

from clustertrain.track.base import Point, Tracker, Unreachable
from clustertrain.track.relay import Summary, alongside, job_fields, relay
from clustertrain.track.trackers import NAMES, check_uri, make

__all__ = [
    "NAMES",
    "Point",
    "Summary",
    "Tracker",
    "Unreachable",
    "alongside",
    "check_uri",
    "job_fields",
    "make",
    "relay",
]

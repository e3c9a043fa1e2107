"""MLflow: one MLflow run per job, in the experiment named for the job, at the tracking URI
(``--uri``, else $MLFLOW_TRACKING_URI), through MLflow's own client. The job's fields are its
params, every metric a point at its step and time, the job's tags its tags; at the end the
plot and the job file are its artifacts and its status is the job's."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

# MLflow's client retries a failed request 7 times with a growing backoff (minutes): the relay
# keeps its own bounded backoff, and says the failure once, so one try a call, 10 s at most.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

import requests  # noqa: E402  (after the variables above, which MLflow reads)
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from clustertrain.errors import UserError  # noqa: E402
from clustertrain.files import printable  # noqa: E402
from clustertrain.runs import Run  # noqa: E402
from clustertrain.track.base import Point, Tracker, Unreachable  # noqa: E402

# What one log_batch call may carry (MLflow's REST API limits).
MAX_METRICS, MAX_PARAMS = 1000, 100
# What MLflow takes in a param's or a metric's name; anything else becomes '_'.
_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
# The job's end in Slurm's words, as MLflow's run statuses say it.
_STATUS = {"COMPLETED": "FINISHED", "CANCELLED": "KILLED", "TIMEOUT": "KILLED"}
T = TypeVar("T")


class MLflow(Tracker):
    name = "mlflow"

    def __init__(self, run: Run, uri: str) -> None:
        super().__init__()
        self.run, self.uri = run, uri
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = ""

    def _call(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One request to the server: one that could not reach it is :class:`Unreachable`
        (tried again later); one it refused is the user's to fix."""
        try:
            return call(*args, **kwargs)
        except requests.RequestException as exc:
            raise Unreachable(f"cannot reach {self.uri} ({type(exc).__name__})") from None
        except MlflowException as exc:
            if isinstance(exc.__cause__, requests.RequestException) or "API request" in str(exc):
                raise Unreachable(f"cannot reach {self.uri}: {_first(exc)}") from None
            raise UserError(f"mlflow at {self.uri}: {_first(exc)}") from None

    def open(self, kept: Mapping[str, Any]) -> None:
        if kept.get("run_id"):
            if kept.get("uri") != self.uri:
                raise UserError(
                    f"--uri: this job was relayed to {printable(str(kept.get('uri')))[:80]}; "
                    f"remove {self.run.path / 'track' / 'mlflow.json'} to relay it to "
                    f"{self.uri} from the start"
                )
            self.run_id = str(kept["run_id"])
            self._call(self.client.get_run, self.run_id)
        else:
            name = _key(self.run.name)
            found = self._call(self.client.get_experiment_by_name, name)
            experiment = found.experiment_id if found else None
            if experiment is None:
                experiment = self._call(self.client.create_experiment, name)
            made = self._call(
                self.client.create_run, experiment, run_name=f"{name}-{self.run.job_id}"
            )
            self.run_id = made.info.run_id
        self.kept = {"uri": self.uri, "run_id": self.run_id}

    def params(self, values: Mapping[str, str]) -> None:
        found = [Param(_key(k), v) for k, v in values.items()]
        for start in range(0, len(found), MAX_PARAMS):
            self._call(self.client.log_batch, self.run_id, params=found[start : start + MAX_PARAMS])

    def points(self, points: Sequence[Point]) -> None:
        found = [Metric(_key(p.name), p.value, int(p.time * 1000), p.step) for p in points]
        for start in range(0, len(found), MAX_METRICS):
            self._call(
                self.client.log_batch, self.run_id, metrics=found[start : start + MAX_METRICS]
            )

    def tags(self, values: Mapping[str, str]) -> None:
        found = [RunTag(k, v) for k, v in values.items()]
        self._call(self.client.log_batch, self.run_id, tags=found)

    def finish(self, state: str, files: Sequence[Path]) -> None:
        for path in files:
            self._call(self.client.log_artifact, self.run_id, str(path))
        self._call(self.client.set_terminated, self.run_id, _STATUS.get(state, "FAILED"))


def _key(name: str) -> str:
    return _KEY.sub("_", name)[:250] or "_"


def _first(exc: Exception) -> str:
    """An exception's first line, printable and short: a server's page is no message."""
    text = str(exc).strip().splitlines()
    return printable(text[0])[:200] if text else type(exc).__name__

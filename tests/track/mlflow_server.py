"""A real ``mlflow server`` on 127.0.0.1 (SQLite, local artifacts), for the MLflow tests and
bench/track.py alike: started in a session of its own, stopped through its PID's group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clustertrain.backends.local import free_port


@contextmanager
def mlflow_server(where: Path) -> Iterator[str]:
    """The server's URI while the body runs, its store and artifacts in ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
        "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{where / 'mlflow.db'}",
        "--artifacts-destination", str(where / "artifacts"),
    ]  # fmt: skip
    # Its own session: the server starts uvicorn under it, all stopped through its PID's group.
    # No job runner (huey's consumers): a process each, and nothing here needs them.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(where / "server.log", "wb")  # noqa: SIM115 (open for the server's life)
    started = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or started.poll() is not None:
                    raise RuntimeError((where / "server.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(started.pid, signal.SIGTERM)
        try:
            started.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(started.pid, signal.SIGKILL)
            started.wait()
        log.close()

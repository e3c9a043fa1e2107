"""What a job's processes are given besides their command: the variables the batch script
exports for every rank, the virtual environment, the offline switches."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath

from clustertrain import protocol
from clustertrain.render.commands import Expand
from clustertrain.spec import JobSpec


def rank_environment(
    spec: JobSpec, run_dir: str, requeue: bool = True
) -> tuple[tuple[str, str], ...]:
    """What clustertrain gives every rank besides the venv and ``spec.env``: the batch script
    exports these, and a local run (:mod:`clustertrain.backends.local`, ``requeue=False``) sets
    them.

    ``run_dir`` may be an :class:`Expand` (a sweep task's ``$TASK_DIR``); paths under it are too.
    """

    def under(name: str) -> str:
        if isinstance(run_dir, Expand):
            return Expand(f"{run_dir}/{name}")
        return str(PurePosixPath(run_dir, name))

    pairs = [
        ("PYTHONUNBUFFERED", "1"),
        (protocol.ENV_RUN_DIR, run_dir),
        (protocol.ENV_OUT_DIR, under(protocol.OUT_DIR)),
        (protocol.ENV_EVENTS_FILE, under(protocol.EVENTS_FILE)),
    ]
    if requeue:
        pairs.append((protocol.ENV_REQUEUE_FILE, under(protocol.REQUEUE_FILE)))
    pairs += [
        (protocol.ENV_RDZV_TIMEOUT_S, str(spec.rdzv_timeout_s)),
        # torchrun and accelerate expand ${rank} themselves and prefix each of a rank's lines.
        (protocol.ENV_RANK_PREFIX, protocol.RANK_PREFIX_TEMPLATE),
    ]
    # Where a script writes its own TensorBoard files: the run folder, which the login node
    # sees too (`tensorboard --logdir` there, or `clustertrain track --to tensorboard`).
    pairs.append((protocol.ENV_TENSORBOARD_DIR, under(protocol.TENSORBOARD_DIR)))
    if spec.offline:
        # W&B's offline runs into the run folder (WANDB_DIR/wandb/offline-run-*), where
        # `clustertrain track --to wandb` finds them to sync from a machine with a route out.
        pairs.append(("WANDB_DIR", run_dir))
    if spec.socket_ifname:
        pairs += [(name, spec.socket_ifname) for name in protocol.SOCKET_IFNAME_VARS]
    return tuple(pairs)


# What ``offline: true`` exports, unless already set: the switches that keep Hugging Face's hub,
# datasets and transformers and W&B from waiting on network timeouts on nodes without a route.
OFFLINE_ENV = (
    ("HF_HUB_OFFLINE", "1"),
    ("HF_DATASETS_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("WANDB_MODE", "offline"),
)


def venv_environment(venv: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """``VIRTUAL_ENV`` and ``PATH`` as the batch script exports them for ``venv`` (nothing
    without one), for what runs outside it: a local run's ranks, the prepare step."""
    if not venv:
        return {}
    return {"VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:{base.get('PATH', '')}"}

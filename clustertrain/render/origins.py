"""What the dry run says of where each value came from: a line per field that some layer gave
(your site's defaults, the job file, a flag, this environment), or that clustertrain chose for
the job (its CPU request), e.g. ``partition: gpu  (site defaults: della)``."""

from __future__ import annotations

import shlex
from typing import Any

from clustertrain.files import printable
from clustertrain.spec import FIELDS, JobSpec

# A value shown longer than this is cut (the scripts below it show it whole).
_WIDTH = 100


def origins_text(spec: JobSpec, origins: tuple[tuple[str, str], ...]) -> str:
    """The dry run's section: each field of ``origins`` (field, where from) in the spec's
    order, with its value in ``spec``."""
    if not origins:
        return ""
    said = dict(origins)
    lines = [f"{name}: {_shown(spec, name)}  ({said[name]})\n" for name in FIELDS if name in said]
    return "#### where the values came from (the others are clustertrain's defaults)\n" + "".join(
        lines
    )


def _shown(spec: JobSpec, name: str) -> str:
    value: Any = getattr(spec, name)
    if value is None and spec.cpus.field == name:  # the CPU request clustertrain chose
        value = spec.cpus.value
    if name in ("setup", "node_setup"):
        text = f"{len(value)} line(s), in the script below"
    elif name == "prepare":
        text = "; ".join(shlex.join(command) for command in value)
    elif name in ("env", "container_env", "sweep"):
        text = " ".join(f"{key}={_joined(val)}" for key, val in value)
    elif isinstance(value, tuple):
        text = shlex.join(value)
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    text = printable(text)
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


def _joined(value: str | tuple[str, ...]) -> str:
    return ",".join(value) if isinstance(value, tuple) else shlex.quote(value)

"""A spec from layers of values, each later one winning: code defaults, your site's defaults
(clustertrain.settings.site), the job file, the flags. Every value is checked by its field's
own check (clustertrain.spec.fields), whichever layer it comes from, and the spec remembers
nothing of where it came from: :func:`build` says that beside it, for the dry run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clustertrain.errors import FieldError
from clustertrain.spec import resources, sweep
from clustertrain.spec.job import FIELDS, VALIDATORS, JobSpec
from clustertrain.spec.jobfile import Plain

# Each field's layers, by label, that gave the value it has (several where values merge).
Origins = dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Layer:
    """One source of values and how the dry run names it. ``unset_none``: a None means "not
    given" (a flag left out). ``site``: a site's defaults, which serve every job there, so its
    per-GPU values apply only to a job that asks for GPUs."""

    label: str
    values: Mapping[str, Any]
    unset_none: bool = False
    site: bool = False


def build_spec(
    job_file: Mapping[str, Any] | None = None,
    *,
    extra_args: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> JobSpec:
    """Merge ``defaults``, a job file's mapping and flag ``overrides`` (each later one wins), and
    validate every field. Raises :class:`FieldError` on the first bad field.

    ``None`` in overrides means "flag not given". ``env`` and ``sbatch_options`` are merged per
    key (a flag's ``A=2`` replaces the file's ``A=1``, and keeps its ``B``); ``setup`` and
    ``node_setup`` lines add up, earlier layers' first; ``args`` given as an override replace
    the file's, while ``extra_args`` (what follows ``--``) are appended to them, so the
    script's parser sees the later value last and lets it win.
    """
    layers = [
        Layer("defaults", defaults or {}),
        Layer("job file", job_file_values(job_file)),
        Layer("flag", overrides, unset_none=True),
    ]
    return build(layers, extra_args)[0]


def build(layers: Sequence[Layer], extra_args: Sequence[str] = ()) -> tuple[JobSpec, Origins]:
    """The spec of ``layers`` (see :func:`build_spec`), and where each value it was given
    came from."""
    merged: dict[str, Any] = {}
    origins: Origins = {}
    from_site: set[str] = set()
    for layer in layers:
        given = {n: v for n, v in layer.values.items() if not (v is None and layer.unset_none)}
        resources.conflict(given)
        for name, value in given.items():
            if name not in VALIDATORS:  # a keyword of the Python API, mistyped
                raise unknown_field(name, value)
            checked = VALIDATORS[name](name, value)
            if isinstance(checked, Plain):  # a spec holds plain values (run folders dump them)
                checked = str(checked)
            merge = _MERGES.get(name)
            if merge and name in merged:
                merged[name] = merge(merged[name], checked)
                origins[name] = (*origins.get(name, ()), layer.label)
            else:
                merged[name], origins[name] = checked, (layer.label,)
            (from_site.add if layer.site else from_site.discard)(name)
            if name in _EITHER and checked is not None:
                merged[_EITHER[name]] = None  # a later layer's script replaces a module
                origins.pop(_EITHER[name], None)
                from_site.discard(_EITHER[name])
    if not merged.get("gpus_per_node"):  # a site's per-GPU defaults serve GPU jobs only
        for name in from_site.intersection(resources.PER_GPU):
            merged.pop(name), origins.pop(name)
    if extra_args:
        merged["args"] = merged.get("args", ()) + VALIDATORS["args"]("args", list(extra_args))
        origins["args"] = (*origins.get("args", ()), "after --")
    return JobSpec(**merged), origins


def job_file_values(job_file: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A job file's mapping, every key a field."""
    if job_file is None:
        return {}
    if not isinstance(job_file, Mapping):
        raise FieldError(
            "job file", type(job_file).__name__, "a job file must be a YAML mapping of field: value"
        )
    unknown = [key for key in job_file if key not in FIELDS]
    if unknown:
        key = min(unknown, key=str)
        raise unknown_field(key, job_file[key])
    return job_file


def unknown_field(key: object, value: object) -> FieldError:
    """The one line for a key that is no field: the fields it resembles (difflib), else all."""
    import difflib  # lazy: start-up time, only for a mistake

    name = str(key)[:100]
    close = difflib.get_close_matches(name, FIELDS, n=3, cutoff=0.6)
    meant = f"did you mean {' or '.join(close)}? " if close else ""
    return FieldError(name, value, f"unknown field; {meant}valid fields: " + ", ".join(FIELDS))


def _merge_env(
    old: tuple[tuple[str, str], ...], new: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    return tuple({**dict(old), **dict(new)}.items())


def _merge_options(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    by_name = {option.partition("=")[0]: option for option in old}
    by_name.update({option.partition("=")[0]: option for option in new})
    return tuple(by_name.values())


def _add_lines(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    return old + new


_MERGES: dict[str, Any] = {
    "env": _merge_env,
    "sbatch_options": _merge_options,
    "sweep": sweep.merge,
    "container_env": _merge_env,
    "setup": _add_lines,
    "node_setup": _add_lines,
}
_EITHER = {a: b for pair in resources.EXCLUSIVE for a, b in (pair, pair[::-1])}

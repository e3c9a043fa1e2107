"""The one YAML reader for job files (and anything else clustertrain reads as YAML).

pyyaml implements YAML 1.1, whose implicit scalars are not what they look like: ``30:00`` is
the integer 1800 (sexagesimal), ``010`` is 8, ``0x50`` is 80, ``1.10`` is 1.1, and ``yes``/``on``
are booleans. Here a plain (unquoted) scalar stays its text, as :class:`Plain`, except ``null``
(``~``, empty) and ``true``/``false``; the spec's validators read a :class:`Plain` as an integer
only where a field is one, and as the text everywhere else. Explicit tags (``!!int 8``) still
build their type. Duplicate keys and anchors/aliases are refused; the file must be a regular
file (a FIFO or a device would block), at most 1 MiB.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from clustertrain.errors import FieldError

MAX_BYTES = 1 << 20
MAX_INT_CHARS = 64  # an explicit !!int's text; no field or argument needs a longer one


class Plain(str):
    """An unquoted YAML scalar, kept as the text the user wrote."""


def _loader() -> type:
    import yaml  # lazy: start-up time; a dry run without a job file never reads YAML

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2-like plain scalars and no duplicate keys."""

        yaml_implicit_resolvers: dict[Any, Any] = {}

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise FieldError(
                        "job file", "a key that is a list or a mapping", "keys are field names"
                    )
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise FieldError(
                        str(key), "(twice)", "a YAML file may set each key once; remove one"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
    )
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    Loader.add_constructor("tag:yaml.org,2002:str", _construct_str)
    Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    return Loader


def _construct_int(loader: Any, node: Any) -> int | Plain:
    # An explicit !!int is bounded before it is converted: 0x and 5,000 hex digits convert,
    # and then cannot be printed (Python's 4,300-digit limit), far from where it was read.
    # Longer, it stays the text it is, which each field then checks as it would any text (a
    # number field refuses it, naming itself; args' length bound refuses it). A decimal one
    # is bounded by Python itself: past 4,300 digits int() refuses it before converting.
    text = str(node.value)
    if len(text) > MAX_INT_CHARS and not text.lstrip("+-").replace("_", "").isdigit():
        return Plain(text)
    value: int = loader.construct_yaml_int(node)
    return value


def _construct_str(loader: Any, node: Any) -> str:
    # Quoted scalars are "str" by style; plain ones that no resolver claimed are Plain.
    value = loader.construct_scalar(node)
    return Plain(value) if node.style is None else str(value)


def read_file(path: str, what: str = "job file") -> bytes:
    """A regular file's bytes, refused without blocking when it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FieldError(
            what, path, "no such file; give the path of a YAML job file such as jobs/mnist.yaml"
        ) from None
    except OSError as exc:
        raise FieldError(what, path, f"cannot be read ({exc.strerror}); check it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FieldError(what, path, "is not a regular file; give a YAML file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise FieldError(what, path, f"cannot be read ({exc.strerror}); check it") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise FieldError(what, path, f"is larger than 1 MiB; a {what} is a short mapping")
    return data


MAX_FLOW_DEPTH = 16


def _flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow collections (``[`` and ``{``) outside quotes and
    comments: a cheap bound checked before the parser sees the text."""
    depth = deepest = 0
    quote = ""
    for line in text.splitlines():
        k = 0
        while k < len(line):
            c = line[k]
            if quote:
                if c == "\\" and quote == '"':
                    k += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or line[k - 1] in " \t"):
                break
            elif c in "[{":
                depth += 1
                deepest = max(deepest, depth)
            elif c in "]}":
                depth = max(depth - 1, 0)
            k += 1
    return deepest


def load(path: str) -> Any:
    """Read and parse a YAML job file."""
    return parse(read_file(path), path)


def parse(data: bytes, path: str = "<job file>", what: str = "job file") -> Any:
    """``data`` as YAML, by this module's rules; ``what`` names the file in a refusal."""
    import yaml  # lazy: start-up time, as above

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FieldError(what, path, "must be UTF-8 text") from None
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        # PyYAML's pure-Python parser takes about a minute of CPU for 50,000 nested brackets.
        raise FieldError(what, path, f"is nested too deeply to be a {what}")
    try:
        # Bound the document before building it: anchors and aliases are refused at the event
        # level, so no alias can make the built value larger than the file.
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise FieldError(
                    what, path, "uses YAML anchors or aliases (&x, *x); write values out"
                )
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise FieldError(what, path, f"is nested too deeply to be a {what}") from None
    except ValueError:  # an explicit !!int of thousands of digits (Python's 4,300-digit limit)
        raise FieldError(what, path, "holds a number too long to read; write it out") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        said = " ".join(str(getattr(exc, "problem", None) or exc).split())[:200]
        raise FieldError(what, path, f"is not valid YAML{line}: {said}") from None


def flag_mapping(field: str, items: Any, example: str) -> Any:
    """Repeated ``KEY=VALUE`` flags as the mapping a job file would hold; other values as
    given (the field's own check refuses what is not a mapping)."""
    if not isinstance(items, list | tuple):
        return items
    pairs = []
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise FieldError(field, item, f"must be KEY=VALUE, e.g. {example}")
        key, _, value = item.partition("=")
        pairs.append((key, value))
    return dict(pairs)

"""The check of a job's shell lines (``setup``, ``node_setup``): lines of the user's own shell,
which the batch script or each node's launch script runs as written (clustertrain.render).

Each line is one line: a NUL or a newline inside one would be a second line the dry run does
not show as such (or, for bash, the end of the script's text), so it is refused; so is any
other control character but a tab (a carriage return or an escape would make the dry run and
the error message show something else than what runs). The renderer never splits or edits a
line: it hands it to bash's ``eval`` as one single-quoted word, so no line can reach into the
script's other lines.
"""

from __future__ import annotations

from typing import Any

from clustertrain.errors import FieldError

# At most this many lines a field, each at most this many characters.
MAX_LINES, MAX_CHARS = 64, 4096


def shell_lines(name: str, value: Any) -> tuple[str, ...]:
    """``value`` as a job's lines of shell: a list of strings (one string: one line)."""
    example = "a list of shell lines, e.g. ['module load cuda/12.1', 'export NCCL_IB_HCA=mlx5']"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise FieldError(name, value, "must be " + example)
    if len(value) > MAX_LINES:
        raise FieldError(name, f"{len(value)} lines", f"must be at most {MAX_LINES}")
    return tuple(_line(f"{name}[{i}]", line) for i, line in enumerate(value))


def _line(where: str, line: Any) -> str:
    if not isinstance(line, str):
        raise FieldError(where, line, "must be a line of shell as text; quote it in the job file")
    if "\x00" in line or "\n" in line or "\r" in line:
        raise FieldError(
            where, line, "must be one line without a NUL byte or a line break; give each line "
            "as its own item (or join commands with && on one line)",
        )  # fmt: skip
    if not line.strip():
        raise FieldError(where, line, "must not be empty; leave the line out")
    if len(line) > MAX_CHARS:
        raise FieldError(where, line[:40] + "...", f"must be at most {MAX_CHARS} characters")
    if not all(c == "\t" or c.isprintable() for c in line):
        raise FieldError(where, line, "must hold printable characters and tabs only")
    return str(line)

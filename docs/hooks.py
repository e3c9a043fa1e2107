"""MkDocs hook: the field reference (docs/fields.md) is generated from the spec at build time.

Each field of :class:`clustertrain.spec.JobSpec` is declared once (``clustertrain.spec.job._field``)
and the CLI builds its flags from that declaration (``clustertrain.cli.options``); this hook
reads the same declarations, so the docs' table cannot drift from ``--help``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clustertrain.cli.options import default_text
from clustertrain.spec import JobSpec
from clustertrain.spec.flags import flag_name, is_switch

# The table replaces what lies between these (a note for readers of the plain Markdown).
START, END = "<!-- fields -->", "<!-- /fields -->"
PAGE = "fields.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _flag(field: dataclasses.Field[Any]) -> str:
    if field.metadata["flag"] is None:
        return "after `--` on the command line"
    flag = flag_name(field)
    if is_switch(field):
        return f"`{flag}` / `--no-{flag[2:]}`"
    metavar = field.metadata["metavar"] or ("N" if str(field.type).startswith("int") else "")
    repeat = " (repeatable)" if isinstance(field.default, tuple) else ""
    return f"`{flag}{' ' + metavar if metavar else ''}`{repeat}"


def field_table() -> str:
    """One row per JobSpec field: its job-file key, its flag, its default, its help."""
    rows = ["| field | flag | default | what it is |", "|---|---|---|---|"]
    for field in dataclasses.fields(JobSpec):
        shown = default_text(field)
        default = "none" if shown is None else f"`{shown}`"
        rows.append(
            f"| `{field.name}` | {_cell(_flag(field))} | {_cell(default)} "
            f"| {_cell(field.metadata['help'])} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    before, start, rest = markdown.partition(START)
    _, end, after = rest.partition(END)
    if not (start and end):
        raise ValueError(f"docs/{PAGE} lost its {START} ... {END} markers: the table has no place")
    return before + field_table() + after

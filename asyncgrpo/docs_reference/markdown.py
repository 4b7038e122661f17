"""Markdown pieces of the reference pages: table cells that survive both Python-Markdown (mkdocs)
and GitHub's renderer, code spans, and tables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# Outside code spans: `|` would end the cell, `<` could open an HTML tag, `*` emphasis.
_PLAIN_ESCAPES = str.maketrans({"|": r"\|", "<": "&lt;", ">": "&gt;", "*": r"\*"})


def one_line(text: str | None) -> str:
    """Whitespace (newlines of a docstring included) collapsed to single spaces."""
    return " ".join((text or "").split())


def first_paragraph(text: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    return one_line((text or "").strip().split("\n\n")[0])


def _plain(text: str) -> str:
    return text.translate(_PLAIN_ESCAPES)


def cell(text: str | None) -> str:
    """Text (with `code spans`) as one table cell. A code span holding `|` loses its backticks:
    GitHub needs the pipe escaped inside it, Python-Markdown would then show the backslash."""
    text = one_line(text)
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_plain(text[last : match.start()]))
        inner = match.group(2)
        out.append(_plain(inner) if "|" in inner else match.group(0))
        last = match.end()
    out.append(_plain(text[last:]))
    return "".join(out)


def code(text: str) -> str:
    """`text` as a code span, with enough backticks around it; a pipe makes it plain text
    (see `cell`)."""
    text = one_line(text) if "\n" not in text else text.replace("\n", "\\n")
    if not text:
        return '`""`'
    if "|" in text:
        return _plain(text)
    ticks = "`" * (max((len(t) for t in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def value(obj: Any) -> str:
    """A default or an example value as a code span: strings as they are, the rest as JSON."""
    if isinstance(obj, str):
        return code(obj)
    return code(json.dumps(obj, ensure_ascii=False, default=str))


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; the cells must already be escaped (`cell`, `code`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def page(title: str, intro: str, sections: Iterable[str]) -> str:
    """A whole page: its title, the generated-file note, an introduction and its sections."""
    parts = [f"# {title}\n", GENERATED_NOTE, intro.strip() + "\n", *sections]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts if p.strip())


REGENERATE = "python -m asyncgrpo.docs_reference"
GENERATED_NOTE = f"Generated from the code by `{REGENERATE}`: do not edit this page.\n"

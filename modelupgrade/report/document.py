"""Reports as documents: a list of blocks, and the one renderer that turns it into markdown or HTML.

Every report of the project (the study report, the flows' upgrade, lineage and backfill reports)
is built from these blocks, so a table or a missing value looks the same in each, and the
markdown and the HTML of one report say the same.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MISSING = "–"  # a value that was not measured


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    """Text; in markdown it may use inline markup (``code``), which HTML shows as written."""

    text: str


@dataclass(frozen=True)
class Table:
    """A header row and rows of values; ``format_cell`` writes each value, a float with ``digits``
    decimals: one number for every column, or one per column."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    digits: int | Sequence[int] = 4

    def cells(self, row: Sequence[Any]) -> list[str]:
        """One row's values as text."""
        digits = self.digits
        if isinstance(digits, int):
            return [format_cell(value, digits) for value in row]
        return [format_cell(value, d) for value, d in zip(row, digits, strict=True)]


@dataclass(frozen=True)
class Image:
    path: str  # relative to the report's directory
    caption: str


@dataclass(frozen=True)
class CodeBlock:
    """Preformatted text (a tree, a log), shown exactly as it is."""

    text: str
    language: str = "text"


@dataclass(frozen=True)
class BulletList:
    items: Sequence[str]


@dataclass(frozen=True)
class Details:
    """A titled list of particulars below a table: in HTML folded (``<details>``), in markdown
    the title in bold over the list."""

    summary: str
    items: Sequence[str]


Block = Heading | Paragraph | Table | Image | CodeBlock | BulletList | Details


def format_cell(value: Any, digits: int = 4) -> str:
    """A table value as text: ``digits`` decimals, ``–`` for None or NaN, yes/no for booleans."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _markdown_cell(text: str) -> str:
    # A '|' would end the cell and a line break the row: a free-text cell (an error message)
    # must not break the table.
    return text.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")


def _markdown_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(_markdown_cell(c) for c in cells) + " |"


def render_markdown(title: str, blocks: Iterable[Block]) -> str:
    lines = [f"# {title}", ""]
    for block in blocks:
        match block:
            case Heading(text, level):
                lines.append(f"{'#' * level} {text}")
            case Paragraph(text):
                lines.append(text)
            case Table(columns, rows):
                lines.append(_markdown_row(columns))
                lines.append("|" + "---|" * len(columns))
                lines += [_markdown_row(block.cells(row)) for row in rows]
            case Image(path, caption):
                lines.append(f"![{caption}]({path})")
            case CodeBlock(text, language):
                lines += [f"```{language}", text, "```"]
            case BulletList(items):
                lines += [f"- {item}" for item in items]
            case Details(summary, items):
                lines += [f"**{summary}**", ""] + [f"- {item}" for item in items]
        lines.append("")
    return "\n".join(lines)


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:80em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.25em .6em;"
    "text-align:right}th{background:#eee}td:first-child,th:first-child,td.text{text-align:left}"
    # Figures are drawn as wide as the text column (1,100 px): shown unscaled, without the
    # browser's default figure indent.
    "figure{margin:1em 0}img{max-width:100%}figcaption{color:#555}"
    "summary{cursor:pointer;margin:.4em 0}"
    "</style></head><body>"
)


# A cell that starts with a number (a sign, a p-value's "<" or a missing value's dash allowed):
# right-aligned, as numbers are; any other text reads from the left.
_NUMBER = re.compile(r"[+\-−<≤≥ ]*\d|–$")


def _html_cell(text: str) -> str:
    """A table cell: text left-aligned, numbers right-aligned; a mean ± its spread kept on one
    line."""
    shown = html.escape(text).replace(" ± ", "&nbsp;±&nbsp;")
    return f"<td>{shown}</td>" if _NUMBER.match(text) else f'<td class="text">{shown}</td>'


def render_html(title: str, blocks: Iterable[Block]) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        _STYLE,
        f"<h1>{esc(title)}</h1>",
    ]
    for block in blocks:
        match block:
            case Heading(text, level):
                parts.append(f"<h{level}>{esc(text)}</h{level}>")
            case Paragraph(text):
                parts.append(f"<p>{esc(text)}</p>")
            case Table(columns, rows):
                head = "".join(f"<th>{esc(c)}</th>" for c in columns)
                body = "".join(
                    "<tr>" + "".join(_html_cell(cell) for cell in block.cells(row)) + "</tr>"
                    for row in rows
                )
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            case Image(path, caption):
                parts.append(
                    f'<figure><img src="{esc(path)}" alt="{esc(caption)}">'
                    f"<figcaption>{esc(caption)}</figcaption></figure>"
                )
            case CodeBlock(text, _):
                parts.append(f"<pre><code>{esc(text)}</code></pre>")
            case BulletList(items):
                parts.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in items) + "</ul>")
            case Details(summary, items):
                listed = "".join(f"<li>{esc(item)}</li>" for item in items)
                parts.append(
                    f"<details><summary>{esc(summary)}</summary><ul>{listed}</ul></details>"
                )
    parts.append("</body></html>")
    return "\n".join(parts)

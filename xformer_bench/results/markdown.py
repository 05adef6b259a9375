"""A :class:`Table` as a GitHub-flavoured Markdown table with a one-line note."""

from __future__ import annotations

from xformer_bench.results.confounds import mark, note
from xformer_bench.results.table import Style, Table, caption, cell_text


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


STYLE = Style(missing="—", plus_minus=" ± ", bold=lambda s: f"**{s}**", escape=escape)


def render(table: Table) -> str:
    header = ["Variant", *(escape(c.title) for c in table.columns)]
    align = [":---", *("---:" for _ in table.columns)]
    lines = [f"## {escape(table.experiment)}", "", _line(header), _line(align)]
    for row in table.rows:
        lines.append(_line([escape(row.label + mark(row)),
                            *(cell_text(cell, column, STYLE)
                              for cell, column in zip(row.cells, table.columns))]))
    lines += ["", escape(caption(table, " ± ", "—")), ""]
    lines += [line for sentence in table.summary for line in (escape(sentence), "")]
    if note(table.rows, table.baseline):  # the confounds, under the table
        lines += [escape(note(table.rows, table.baseline)), ""]
    return "\n".join(lines)


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"

"""Markdown pieces shared by the report and the findings table."""

from __future__ import annotations

from collections.abc import Sequence

MISSING = "–"  # shown in tables for values that do not apply or could not be computed


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table; a ``|`` inside a cell is escaped.

        >>> print(markdown_table(["a", "b"], [["1", "x|y"]]))
        | a | b |
        | --- | --- |
        | 1 | x\\|y |
    """
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])

"""The small HTML pieces every thunderviz page is built from: escaping, tables, the decisions table, a page.

One place, so that every name from user code goes through the same ``escape`` (text and attribute safe) and the
decisions table looks the same in the trace report, the run report, the widgets' static picture and the demo page.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # read by attribute; render never imports the decision table itself
    from thunderviz.parallel.decisions import Decision

__all__ = ["DECISION_COLUMNS", "counted", "decisions_table", "escape", "page", "table"]

#: The columns of a strategy decision shown to people: what was set up, and the decision's one-line headline (its
#: full reasoning opens under it).
DECISION_COLUMNS = ("target", "decision")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 op`` / ``3 ops``: a count with its noun in the right number ("1 collectives" reads as a broken report)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def escape(value: Any) -> str:
    """``str(value)`` made safe for HTML text and quoted attributes."""
    return html.escape(str(value), quote=True)


def table(headers: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """A plain table; every cell is escaped, ``None`` shows as empty."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape('' if c is None else c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def decisions_table(decisions: Sequence[Decision]) -> str:
    """The strategies' jit decisions, one row each: the headline, and the full reasoning one click away (a
    ``<details>``, so it needs no script)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in DECISION_COLUMNS)
    rows = "".join(
        f"<tr><td>{escape(d.target)}</td><td><details class='tv-decision'><summary>{escape(d.headline)}</summary>"
        f"<p>{escape(d.case)} \u00b7 {escape(d.action)}: {escape(d.reason)}</p></details></td></tr>"
        for d in decisions
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def page(title: str, body: str, *, heading: str | None = None, style: str = "", script: str = "") -> str:
    """A complete, self-contained page: ``title`` in ``<title>``, ``heading`` (default: the title) as ``<h1>``,
    our own style and script only."""
    head_style = f"<style>{style}</style>" if style else ""
    tail_script = f"<script>{script}</script>" if script else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(title)}</title>"
        f"{head_style}</head><body><h1>{escape(title if heading is None else heading)}</h1>\n{body}\n{tail_script}"
        "</body></html>\n"
    )

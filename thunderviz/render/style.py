"""The one stylesheet of every static thunderviz output, scoped to our own root element.

Why scoped: a report is HTML inside a JupyterLab output, and a rule such as ``pre{max-height:420px}`` or
``body{max-width:1400px}`` there restyles every stream output and markdown cell of the notebook. Every rule here
starts with ``ROOT``, the element ``wrap`` puts around our output, with enough specificity (two classes and an
element, 0,2,2) to win over JupyterLab's own ``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`` (0,2,1),
which would right-align and centre our tables. A standalone page adds only margins and width for its ``body``.
"""

from __future__ import annotations

__all__ = ["PAGE_CSS", "REPORT_CSS", "ROOT", "ROOT_CLASSES", "wrap"]

#: The classes of the element around every thunderviz output, and the selector every rule starts with.
ROOT_CLASSES = "thunderviz-report tv-report"
ROOT = "div.thunderviz-report.tv-report"

_RULES = (
    ("", "font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;color:#1d2733;text-align:left"),
    ("h1", "font-size:22px"),
    ("h2", "font-size:18px;margin-top:32px;border-bottom:1px solid #d5dde6"),
    ("h3", "font-size:15px;margin-top:20px"),
    ("h4", "font-size:14px;margin:14px 0 6px"),
    ("h5", "font-size:13px;margin:10px 0 4px"),
    ("p", "margin:4px 0 8px;text-align:left"),
    (
        "table",
        "border-collapse:collapse;margin:8px 0;margin-left:0;margin-right:0;table-layout:auto;width:auto;"
        "font-size:13px;border:none",
    ),
    ("td, ROOT th", "border:1px solid #d5dde6;padding:3px 8px;text-align:left;vertical-align:top;line-height:1.35"),
    ("th", "background:#eef3f8;font-weight:600"),
    ("tbody tr", "background:transparent"),
    ("td.num", "text-align:right;font-variant-numeric:tabular-nums"),
    ("code, ROOT pre, ROOT .mono", "font-family:SFMono-Regular,Menlo,Consolas,monospace;font-size:12px"),
    ("pre", "background:#f6f8fa;padding:8px;overflow:auto;max-height:420px;margin:4px 0;white-space:pre"),
    (".ok", "color:#1e7b34"),
    (".bad", "color:#b3261e;font-weight:600"),
    # as tall as its graph: a static graph in a fixed-height box hid lm_head and the root reduce_scatter behind an
    # inner scrollbar; the page scrolls instead
    (".graph", "overflow-x:auto;overflow-y:hidden;border:1px solid #d5dde6;padding:6px;background:#fff"),
    (".graph svg", "max-width:100%;height:auto"),
    (".graph g.node", "cursor:pointer"),
    ("details", "margin:4px 0"),
    ("summary", "cursor:pointer"),
    ("tr.coll td", "background:#fde6d2"),
    ("tr.wait td", "background:#fff4cc"),
    (".note", "color:#5b6b7c"),
)


def _css(root: str) -> str:
    out = []
    for selector, declarations in _RULES:
        full = root if not selector else f"{root} {selector.replace('ROOT', root)}"
        out.append(f"{full}{{{declarations}}}")
    return "\n".join(out) + "\n"


#: Every rule, scoped to ``ROOT``.
REPORT_CSS = _css(ROOT)
#: A standalone page: its body's margins and width, then the scoped rules.
PAGE_CSS = (
    "body{margin:24px;max-width:1400px;background:#fff;color:#1d2733;"
    "font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif}\nbody>h1{font-size:22px}\n" + REPORT_CSS
)


def wrap(body: str, *, style: bool = True) -> str:
    """``body`` inside our root element, with the scoped stylesheet (once per output) when ``style``."""
    sheet = f"<style>{REPORT_CSS}</style>" if style else ""
    return f"<div class='{ROOT_CLASSES}'>{sheet}{body}</div>"

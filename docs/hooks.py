"""MkDocs hooks: the API reference from ``thunderviz.__all__`` and the tutorial page from the executed tutorial.

The reference is generated, not listed by hand, so a name added to the public API gets its entry (rendered from its
docstring by mkdocstrings) without anyone remembering the docs; the sections below only order it. The tutorial page
is the notebook ``thunderviz demo`` executed (``demo-output/tutorial.executed.ipynb``, or the file
``THUNDERVIZ_DOCS_TUTORIAL`` names), with the pictures ``docs/screenshots.py`` took where its widgets stood.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
if str(DOCS) not in sys.path:
    sys.path.insert(0, str(DOCS))

from tutorial_page import write_page  # noqa: E402 (docs/ is not a package: mkdocs loads this file by path)

#: The reference's sections, in reading order; a public name in none of them lands in "More".
SECTIONS: dict[str, list[str]] = {
    "Strategies": ["ThunderFSDPStrategy", "ThunderDDPStrategy", "ThunderAutoStrategy"],
    "Planning": ["plan", "Plan"],
    "Notebook views": ["TraceView", "compare", "compare_runs", "TimelineView", "load_ipython_extension"],
    "Traces and timelines": [
        "capture",
        "save",
        "load",
        "TraceBundle",
        "collective_changes",
        "render_html",
        "record_timeline",
    ],
    "Processes": ["run_ranks"],
    "Errors": [
        "ThundervizError",
        "JitDecisionError",
        "UnsupportedThunderError",
        "RankError",
        "TraceFormatError",
        "TraceCaptureError",
        "PlanError",
    ],
}
MARKER = "<!-- the reference entries are generated here by docs/hooks.py -->"


def _defining_module(module: str, name: str) -> str:
    """Follow packages' lazy re-exports (their ``_LAZY`` maps) to the module that defines ``name``, importing only
    the packages on the way (they are light by design: the heavy modules load on first attribute access)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.submodule_search_locations is None:  # a plain module: lazy maps name the definer
        return module
    mod = importlib.import_module(module)
    lazy = getattr(mod, "_LAZY", {})
    if name in lazy and lazy[name] != module:
        return _defining_module(lazy[name], name)
    value = mod.__dict__.get(name)
    return getattr(value, "__module__", None) or module


def public_paths() -> dict[str, str]:
    """Each public name -> the dotted path mkdocstrings renders it from (where it is defined)."""
    import thunderviz

    return {name: f"{_defining_module('thunderviz', name)}.{name}" for name in thunderviz.__all__}


def reference_markdown() -> str:
    paths = public_paths()
    placed = [n for names in SECTIONS.values() for n in names]
    sections = dict(SECTIONS)
    if rest := sorted(set(paths) - set(placed)):
        sections["More"] = rest
    lines = []
    for title, names in sections.items():
        lines += [f"## {title}", ""]
        for name in names:
            if name not in paths:
                raise PluginError(f"docs/hooks.py lists {name!r}, which is not in thunderviz.__all__")
            lines += [f"::: {paths[name]}", "    options:", "      heading_level: 3", ""]
    return "\n".join(lines)


def on_pre_build(config: Any, **_: Any) -> None:
    executed = Path(os.environ.get("THUNDERVIZ_DOCS_TUTORIAL") or REPO / "demo-output" / "tutorial.executed.ipynb")
    if not executed.exists():
        raise PluginError(
            f"the tutorial page is the executed tutorial, and {executed} does not exist: run `./run demo` first "
            "(or set THUNDERVIZ_DOCS_TUTORIAL to an executed tutorial.ipynb)"
        )
    write_page(executed, DOCS / "images" / "shots.json", DOCS / "tutorial.ipynb")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "api.md":
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/api.md must hold the line {MARKER!r} where the reference goes")
    return markdown.replace(MARKER, reference_markdown())

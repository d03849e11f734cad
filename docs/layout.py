"""Draw the package layout: which process each package runs in and which way imports may go.

Run from the repository root: ``python docs/layout.py``. It writes ``docs/images/layout.dot`` and, with Debian's
graphviz ``dot``, ``docs/images/layout.svg`` (shown in docs/architecture.md). The picture is read from the tree, not
drawn by hand: the packages and their subpackages are the folders under ``thunderviz/``, the arrows are the
``may_import`` sets of ``tests/test_architecture.py``'s ``RULES``, and only the process each package runs in is
stated here (``PROCESS``). tests/test_docs.py regenerates the DOT source and compares it with the committed file, so
a layout change without a new picture fails the suite.

Only our own package and module names reach the labels (no user code is read), and they are quoted for DOT anyway.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "thunderviz"
IMAGES = REPO / "docs" / "images"

#: Where each package (a folder or a module directly under thunderviz/) runs. A new package must be added here.
PROCESS: dict[str, str] = {
    "__init__": "anywhere",
    "cli": "anywhere",
    "trace": "anywhere",
    "timeline": "anywhere",
    "render": "anywhere",
    "parallel": "both",
    "pool": "kernel",
    "cell": "kernel",
    "rank": "rank",
    "reports": "anywhere",
    "demos": "both",
    "thunder": "rank",
    "strategies": "rank",
    "notebook": "kernel",
}

#: The processes, in the order the picture shows them, with the words their box carries.
PROCESSES: dict[str, str] = {
    "kernel": "the Jupyter kernel (the notebook's process)",
    "both": "imported in the kernel and on every rank",
    "rank": "each rank process (an engine, or a Fabric script)",
    "anywhere": "plain data and drawing: any process, no torch needed",
}

#: What a node is called in the picture when its file name alone would not say it.
TITLES = {"__init__": "thunderviz (the public API)", "cli": "cli.py"}


def _quote(text: str) -> str:
    """A DOT string literal (our module names only, but quoted all the same)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _rules() -> tuple[dict[str, frozenset[str]], set[str]]:
    """``RULES``' ``may_import`` per package, and ``BASE`` (what every package may import)."""
    sys.path.insert(0, str(REPO))
    try:
        from tests.test_architecture import BASE, RULES
    finally:
        sys.path.remove(str(REPO))
    return {name: rule.may_import for name, rule in RULES.items()}, set(BASE)


def _packages() -> dict[str, list[str]]:
    """Each package under thunderviz/ (a folder with ``__init__.py``, or a module) -> its subpackages, sorted."""
    out: dict[str, list[str]] = {"__init__": []}
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            out[path.name] = sorted(
                str(sub.parent.relative_to(path)).replace("\\", "/")
                for sub in path.rglob("__init__.py")
                if sub.parent != path and "__pycache__" not in sub.parts
            )
        elif path.suffix == ".py" and path.stem != "__init__":
            out[path.stem] = []
    return out


def dot_source() -> str:
    """The picture as DOT, from the current tree and rules. Raises naming any package without a process."""
    may_import, base = _rules()
    packages = {name: subs for name, subs in _packages().items() if name not in base}
    unplaced = sorted(set(packages) - set(PROCESS))
    if unplaced:
        raise LookupError(f"say which process these packages run in (PROCESS in docs/layout.py): {unplaced}")
    lines = [
        "digraph layout {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.6, newrank=true];',
        '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=11];',
        '  edge [color="#8a8a8a", arrowsize=0.6];',
    ]
    colours = {"kernel": "#e8f0fe", "both": "#f3e8fd", "rank": "#e6f4ea", "anywhere": "#f1f3f4"}
    for process, words in PROCESSES.items():
        lines.append(f"  subgraph cluster_{process} {{")
        lines.append(f'    label={_quote(f"{process}: {words}")}; style=filled; fillcolor="{colours[process]}";')
        for name, subs in packages.items():
            if PROCESS[name] != process:
                continue
            title = TITLES.get(name, f"{name}/" if (PACKAGE / name).is_dir() else f"{name}.py")
            label = title + "".join(f"\n  {sub}/" for sub in subs)
            lines.append(f"    {_quote(name)} [label={_quote(label)}];")
        lines.append("  }")
    lines.append(f"  base [label={_quote('every package may import: ' + ', '.join(sorted(base)))}, shape=note];")
    for name in packages:
        for target in sorted(may_import.get(name, frozenset()) - base):
            if target in packages:
                lines.append(f"  {_quote(name)} -> {_quote(target)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    source = dot_source()
    (IMAGES / "layout.dot").write_text(source, encoding="utf-8")
    dot = shutil.which("dot")
    if dot is None:
        raise SystemExit("wrote docs/images/layout.dot; install graphviz (apt-get install graphviz) to draw the SVG")
    svg = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, check=True).stdout
    (IMAGES / "layout.svg").write_text(svg, encoding="utf-8")
    print("wrote docs/images/layout.dot and docs/images/layout.svg")


if __name__ == "__main__":
    main()

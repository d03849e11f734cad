"""The headless demo: run the tutorial notebook on 2 CPU ranks and write one offline HTML report.

Why run the notebook itself rather than a script that imitates it: the demo then proves the path users take
(a real kernel, ``%load_ext thunderviz``, the magics, the rank pool) and cannot drift from the tutorial.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

__all__ = ["TUTORIAL", "run_demo"]

TUTORIAL = Path(__file__).resolve().parents[2] / "notebooks" / "tutorial.ipynb"

# Appended to the executed copy: every RunReport the tutorial stored, in the order they were made, on one page.
_COLLECT_CELL = """
from thunderviz.notebook.demo import write_reports as _write_reports
_write_reports({{k: v for k, v in list(globals().items()) if type(v).__name__ == "RunReport" and not k.startswith("_")}}, {path!r})
"""


def write_reports(reports: dict, path: str) -> str:
    """One self-contained page with each named report as a section (no script, no network), and its summary."""
    unique: dict = {}
    for name, report in reports.items():
        if all(report is not r for r in unique.values()):  # a loop variable holding a report already named
            unique[name] = report
    sections = [f"<section><h2>{html.escape(n)}</h2>{r.to_html(standalone=False)}</section>" for n, r in unique.items()]
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>thunderviz demo</title></head><body>"
            "<h1>thunderviz demo: the tutorial on 2 CPU ranks</h1>" + "\n".join(sections) + "</body></html>\n")
    Path(path).write_text(page, encoding="utf-8")
    Path(path).with_suffix(".txt").write_text(summarize(unique), encoding="utf-8")
    return path


def summarize(reports: dict) -> str:
    """The terminal story of the demo: per cell, what the strategy decided and which collectives rank 0 traced."""
    lines = []
    for name, report in reports.items():
        strategy = (report.strategy or {}).get("kind", "?")
        lines.append(f"[{name}] {strategy} on {report.world_size} ranks ({report.backend})")
        for d in report.decisions:
            lines.append(f"  {d.get('case')} -> {d.get('action')}: {d.get('reason')}")
        for obj, ledgers in report.ledgers.items():
            counts = ", ".join(f"{n} {k}" for k, n in sorted(ledgers[min(ledgers)].counts().items())) or "none"
            agree = "ranks agree" if not report.mismatches.get(obj) else "MISMATCH across ranks"
            lines.append(f"  {obj}: {counts}; {agree}")
        if not report.decisions and not report.ledgers:
            lines.append("  (no model was set up or traced in this cell)")
        lines.extend(f"  problem: {p}" for p in report.problems)
    return "\n".join(lines) + "\n"


def run_demo(out_dir: Path, *, timeout_s: int = 900, notebook: Path = TUTORIAL) -> Path:
    """Execute the tutorial headlessly (nbclient, a real kernel) and return the path of the HTML report.

    Also writes the executed notebook next to it (``tutorial.executed.ipynb``) for inspection.
    """
    import nbformat
    from nbclient import NotebookClient

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = (out_dir / "thunderviz-demo.html").resolve()
    nb = nbformat.read(str(notebook), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_COLLECT_CELL.format(path=str(report_path))))
    # the kernel must import this checkout's thunderviz, wherever the notebook's directory is
    root = str(Path(__file__).resolve().parents[2])
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, env_path) if p)
    try:
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(notebook.parent)}})
        client.execute()
    finally:
        if env_path:
            os.environ["PYTHONPATH"] = env_path
        else:
            os.environ.pop("PYTHONPATH", None)
    nbformat.write(nb, str(out_dir / "tutorial.executed.ipynb"))
    if not report_path.exists():
        raise RuntimeError(f"the tutorial ran but did not write {report_path}; see {out_dir / 'tutorial.executed.ipynb'}")
    return report_path

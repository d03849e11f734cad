"""Run the tutorial notebook headlessly on 2 CPU ranks and write one offline HTML report (``thunderviz demo``).

Why run the notebook itself rather than a script that imitates it: the demo then proves the path users take
(a real kernel, ``%load_ext thunderviz``, the magics, the rank pool) and cannot drift from the tutorial.

The notebook is package data (``thunderviz/demos/tutorial.ipynb``), read through ``importlib.resources``, so the
demo works from a wheel or ``pip install .`` as well as from a checkout. The kernel starts in the output folder and
imports the same thunderviz as this process (see ``_kernel_env``).
"""

from __future__ import annotations

import os
import site
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["FURTHER", "TUTORIAL", "run_tutorial", "summarize", "write_reports"]

#: The tutorial as shipped inside the package: the tour the demo runs (ZERO2 against ZERO3, DDP, a timeline, the plan).
TUTORIAL: Traversable = resources.files(__package__).joinpath("tutorial.ipynb")
#: Its sequel, shipped beside it and run by the test suite (not by the demo, which must stay short): a module or a
#: function you jitted, activation checkpointing, a straggler on the timeline, faults.
FURTHER: Traversable = resources.files(__package__).joinpath("further.ipynb")

#: The file names ``run_tutorial`` writes into its output folder.
REPORT_NAME = "thunderviz-demo.html"
EXECUTED_NAME = "tutorial.executed.ipynb"
COPY_NAME = "tutorial.ipynb"

# Appended to the executed copy: every RunReport the tutorial stored, in the order they were made, on one page; and
# which thunderviz the kernel imported (the installed-package test reads it).
_COLLECT_CELL = """
import thunderviz as _thunderviz
from thunderviz.demos.tutorial import write_reports as _write_reports
print("kernel imported thunderviz from", _thunderviz.__file__)
_reports = {{k: v for k, v in list(globals().items()) if type(v).__name__ == "RunReport" and not k.startswith("_")}}
_write_reports(_reports, {path!r})
"""


def write_reports(reports: dict[str, Any], path: str) -> str:
    """One self-contained page (no script, no network): contents, the "which strategy?" table of the cells that
    trained (with the plan a cell ran by) and the runs compared in pairs of one workload, then each named report as a
    section; and its terminal summary beside it."""
    unique: dict[str, Any] = {}
    for name, report in reports.items():
        if all(report is not r for r in unique.values()):  # a loop variable holding a report already named
            unique[name] = report
    from thunderviz.render.run_report import reports_page
    from thunderviz.render.runs_compared import RUNS_COMPARED_ID, runs_compared_html
    from thunderviz.render.strategy_table import STRATEGIES_ID
    from thunderviz.reports.strategy_table import compare_runs

    # the "which strategy?" table over the cells that trained under a strategy, grouped by workload, with the plan a
    # cell ran by (its candidates and its budget), at the top of the page; then each pair of runs of one workload
    # under different strategies (the compare view's verdict and groups, as static text); both in the contents
    trained = {n: r for n, r in unique.items() if r.strategy is not None and (r.step_memory or r.ledgers)}
    plan = next((r.plan for r in trained.values() if getattr(r, "plan", None) is not None), None)
    links, summary = [], ""
    if trained:
        summary = compare_runs(trained, plan=plan)._repr_html_()
        links.append((STRATEGIES_ID, "Which strategy?"))
        compared = runs_compared_html(trained)
        if compared:
            summary += compared
            links.append((RUNS_COMPARED_ID, "Runs compared"))
    page = reports_page(
        unique,
        title="thunderviz demo",
        heading="thunderviz demo: the tutorial on 2 CPU ranks",
        summary=summary,
        summary_links=links,
    )
    Path(path).write_text(page, encoding="utf-8")
    Path(path).with_suffix(".txt").write_text(summarize(unique), encoding="utf-8")
    return path


def summarize(reports: dict[str, Any]) -> str:
    """The terminal story of the demo: per cell, what the strategy decided and which collectives rank 0 traced."""
    lines = []
    for name, report in reports.items():
        strategy = report.strategy.kind if report.strategy is not None else "?"
        lines.append(f"[{name}] {strategy} on {report.world_size} ranks ({report.backend})")
        for d in report.decisions:  # the headline; the reasoning is one attribute away (``d.reason``)
            lines.append(f"  {d.headline}")
        for obj, ledgers in report.ledgers.items():
            counts = ", ".join(f"{n} {k}" for k, n in sorted(ledgers[min(ledgers)].counts().items())) or "none"
            agree = "ranks agree" if not report.mismatches.get(obj) else "MISMATCH across ranks"
            lines.append(f"  {obj}: {counts}; {agree}")
        if not report.decisions and not report.ledgers:
            lines.append("  (no model was set up or traced in this cell)")
        if getattr(report, "timeline_data", None) is not None:  # a --timeline cell: who held the others up
            lines.append(f"  timeline: {report.timeline.analysis().summary()[0]}")
        lines.extend(f"  problem: {p}" for p in report.problems)
    return "\n".join(lines) + "\n"


def _kernel_env() -> dict[str, str]:
    """The kernel's environment: ours, plus the folder holding the thunderviz we run, unless it is a site dir.

    The kernel starts in the output folder, so a thunderviz this process found through its working directory (a
    checkout run as ``python -m thunderviz.cli``) would not be found there; an installed one (wheel, editable) is
    found anyway and its site-packages is left where the interpreter puts it.
    """
    import thunderviz

    env = dict(os.environ)
    package_parent = str(Path(thunderviz.__file__).resolve().parents[1])
    site_dirs = {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if package_parent not in site_dirs:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


def _offer_a_copy(out_dir: Path) -> Path:
    """Clean copies of the tutorial and its sequel to work through in ``out_dir``; existing ones (maybe edited) are
    kept. Returns the tutorial's."""
    for notebook, name in ((TUTORIAL, COPY_NAME), (FURTHER, FURTHER.name)):
        copy = out_dir / name
        if not copy.exists():
            copy.write_text(notebook.read_text(encoding="utf-8"), encoding="utf-8")
    return out_dir / COPY_NAME


def run_tutorial(out_dir: Path | str, *, timeout_s: int = 900) -> Path:
    """Execute the packaged tutorial headlessly (nbclient, a real kernel) and return the path of the HTML report.

    Writes into ``out_dir``: the report (``thunderviz-demo.html``) and its text summary (``.txt``), the executed
    notebook (``tutorial.executed.ipynb``) for inspection, and clean ``tutorial.ipynb`` and ``further.ipynb`` to work
    through (each kept if one is already there). A cell that fails raises nbclient's ``CellExecutionError`` naming
    the cell.
    """
    import nbformat
    from nbclient import NotebookClient

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / REPORT_NAME
    nb = nbformat.reads(TUTORIAL.read_text(encoding="utf-8"), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_COLLECT_CELL.format(path=str(report_path))))
    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(out_dir)}}
    )
    try:
        client.execute(env=_kernel_env())
    finally:
        nbformat.write(nb, str(out_dir / EXECUTED_NAME))
    _offer_a_copy(out_dir)
    if not report_path.exists():
        raise RuntimeError(f"the tutorial ran but did not write {report_path}; see {out_dir / EXECUTED_NAME}")
    return report_path

"""What a piece of code imports, read from ``sys.modules`` of a fresh interpreter (this test process imported
everything long ago), and the module lists the import-boundary tests check, defined once.

``modules_loaded_by(*steps)`` runs the steps one after another in ONE interpreter and returns, after each, every
top-level module loaded so far. Probes that all assert "none of these is loaded" can therefore share one
interpreter: a later step's set holds everything the earlier steps loaded, so its check is at least as strict as
running that step alone. ``light_paths()`` is that shared run for the paths that must stay light (opening and
drawing saved traces and timelines, ``thunderviz render``), once per session.

The interpreter gets only ``PATH`` and ``PYTHONPATH`` (the repository root): what a fresh shell would have, nothing
this test session set.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLUSTER",
    "HEAVY",
    "LIGHT_STEPS",
    "NOTEBOOK",
    "ROOT",
    "LightRun",
    "light_paths",
    "modules_loaded_by",
    "present",
]

ROOT = Path(__file__).resolve().parents[2]

#: The training stack: what opening a saved trace or timeline must never need.
HEAVY = ("torch", "thunder", "lightning", "lightning_fabric")
#: The notebook stack: what nothing below ``thunderviz.notebook`` (nor its data code) may import.
NOTEBOOK = ("IPython", "ipywidgets", "anywidget")
#: The rank cluster.
CLUSTER = ("ipyparallel",)

_MARK = "@@modules@@"


def modules_loaded_by(*steps: str, run_package_init: bool = True, timeout: float = 300) -> list[set[str]]:
    """Run ``steps`` in order in one fresh interpreter; after each, the top-level names in ``sys.modules``.

    With ``run_package_init=False`` the ``thunderviz`` package object is made without running
    ``thunderviz/__init__.py``, so what is seen is what the modules themselves import, whatever the package's
    ``__init__`` does. A step that raises fails the probe with the interpreter's stderr.
    """
    script = ["import sys", "_seen = []", "_ns = {}"]
    if not run_package_init:
        script += [
            "import types",
            f"_pkg = types.ModuleType('thunderviz'); _pkg.__path__ = [{str(ROOT / 'thunderviz')!r}]",
            "sys.modules['thunderviz'] = _pkg",
        ]
    for i, step in enumerate(steps):
        script += [
            f"exec(compile({step!r}, '<step {i}>', 'exec'), _ns)",
            "_seen.append(sorted({m.split('.')[0] for m in sys.modules}))",
        ]
    script += ["import json", f"print({_MARK!r} + json.dumps(_seen))"]  # json only after the last reading
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(_MARK))
    return [set(names) for names in json.loads(line[len(_MARK) :])]


def present(loaded: set[str], *groups: tuple[str, ...]) -> list[str]:
    """The modules of ``groups`` that ``loaded`` holds, sorted (``[]`` is what a boundary test expects)."""
    return sorted(m for group in groups for m in group if m in loaded)


#: The light paths, in the order ``light_paths`` runs them; each must load nothing of HEAVY, NOTEBOOK, CLUSTER.
LIGHT_STEPS = {
    "import thunderviz": "import thunderviz",
    "open and draw a saved trace": "import thunderviz.render.html, thunderviz.trace.file",
    "open and draw a saved timeline": (
        "import thunderviz.timeline.model, thunderviz.timeline.analysis, thunderviz.timeline.build, "
        "thunderviz.timeline.chrome, thunderviz.render.timeline_svg"
    ),
    "the notebook's view data": "import thunderviz.notebook.viewdata",
    "thunderviz render": (
        "from thunderviz.cli import main\n"
        "assert main(['render', *{files!r}, '--out', {out!r}]) == 0, 'thunderviz render failed'"
    ),
}


@dataclass(frozen=True)
class LightRun:
    """``loaded``: per step of ``LIGHT_STEPS``, every module loaded up to it; ``rendered``: the page the
    ``thunderviz render`` step wrote (from two small rank files)."""

    loaded: dict[str, set[str]]
    rendered: Path


@functools.cache
def light_paths() -> LightRun:
    """``LIGHT_STEPS`` in one fresh interpreter, once per session."""
    from tests.helpers.small_traces import write_rank_files

    folder = Path(tempfile.mkdtemp(prefix="thunderviz-light-paths-"))
    files = [str(f) for f in write_rank_files(folder)]
    rendered = folder / "r.html"
    steps = [code.format(files=files, out=str(rendered)) for code in LIGHT_STEPS.values()]
    return LightRun(dict(zip(LIGHT_STEPS, modules_loaded_by(*steps), strict=True)), rendered)

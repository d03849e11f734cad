"""Opening and drawing a saved trace needs neither thunder nor lightning (nor torch). Each check runs in a fresh
interpreter and reads ``sys.modules``. (That the core and render layers never import the notebook stack is
tests/test_layering.py's job.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What reading and drawing a saved trace file uses.
FILE_TO_PICTURE = [
    "thunderviz.trace.model",
    "thunderviz.trace.file",
    "thunderviz.trace.validate",
    "thunderviz.trace.ledger",
    "thunderviz.trace.diff",
    "thunderviz.trace.attribution",
    "thunderviz.render.graph",
    "thunderviz.render.markup",
    "thunderviz.render.html",
    "thunderviz.render.run_report",
    "thunderviz.notebook.viewdata",
]
HEAVY = ["thunder", "lightning", "lightning_fabric", "torch"]
NOTEBOOK = ["IPython", "ipywidgets", "anywidget"]


def _imported_after(modules: list[str], *, skip_package_init: bool) -> list[str]:
    """Top-level packages in ``sys.modules`` after importing ``modules`` in a fresh interpreter.

    With ``skip_package_init`` the ``thunderviz`` package object is made without running ``thunderviz/__init__.py``,
    so the result is what the modules themselves import, whatever the package's own ``__init__`` does.
    """
    code = [
        "import sys, json, types",
        *(
            [
                f"pkg = types.ModuleType('thunderviz'); pkg.__path__ = [{str(ROOT / 'thunderviz')!r}]",
                "sys.modules['thunderviz'] = pkg",
            ]
            if skip_package_init
            else []
        ),
        *(f"import {m}" for m in modules),
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(code)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_reading_and_drawing_a_trace_file_imports_no_thunder_lightning_or_torch():
    loaded = _imported_after(FILE_TO_PICTURE, skip_package_init=True)
    assert "thunderviz" in loaded and "json" in loaded  # the probe saw the imports
    assert [m for m in HEAVY + NOTEBOOK if m in loaded] == []


def test_capture_module_defers_thunder_until_called():
    modules = ["thunderviz.thunder.capture", "thunderviz.trace.file", "thunderviz.trace.model"]
    loaded = _imported_after(modules, skip_package_init=True)
    assert [m for m in HEAVY + NOTEBOOK if m in loaded] == []


def test_import_thunderviz_then_render_imports_no_thunder_or_lightning():
    """What ``thunderviz render FILE`` does: the package, then the file and the renderer."""
    loaded = _imported_after(["thunderviz", "thunderviz.render.html", "thunderviz.trace.file"], skip_package_init=False)
    assert "thunderviz" in loaded
    assert [m for m in HEAVY + NOTEBOOK if m in loaded] == []

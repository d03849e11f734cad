"""Opening and drawing a saved trace needs neither thunder nor lightning (nor torch). Each check runs in a fresh
interpreter and reads ``sys.modules``. (That the core and render layers never import the notebook stack is
tests/test_layering.py's job.)"""

from __future__ import annotations

import functools

from tests.helpers.fresh_interpreter import HEAVY, NOTEBOOK, light_paths, modules_loaded_by, present

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
#: What a rank imports to capture traces it saves.
CAPTURE = ["thunderviz.thunder.capture.traces", "thunderviz.trace.file", "thunderviz.trace.model"]


@functools.cache
def _without_package_init() -> tuple[set[str], set[str]]:
    """FILE_TO_PICTURE, then CAPTURE, in one fresh interpreter that never runs ``thunderviz/__init__.py``."""
    steps = ("\n".join(f"import {m}" for m in modules) for modules in (FILE_TO_PICTURE, CAPTURE))
    first, both = modules_loaded_by(*steps, run_package_init=False)
    return first, both


def test_reading_and_drawing_a_trace_file_imports_no_thunder_lightning_or_torch():
    loaded, _ = _without_package_init()
    assert "thunderviz" in loaded and "json" in loaded  # the probe saw the imports
    assert present(loaded, HEAVY, NOTEBOOK) == []


def test_capture_module_defers_thunder_until_called():
    _, loaded = _without_package_init()  # CAPTURE after FILE_TO_PICTURE: at least as strict as CAPTURE alone
    assert present(loaded, HEAVY, NOTEBOOK) == []


def test_import_thunderviz_then_render_imports_no_thunder_or_lightning():
    """What ``thunderviz render FILE`` does: the package, then the file and the renderer."""
    loaded = light_paths().loaded["open and draw a saved trace"]
    assert "thunderviz" in loaded
    assert present(loaded, HEAVY, NOTEBOOK) == []

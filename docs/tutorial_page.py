"""The tutorial as a page of the site: the executed notebook, with a picture where each live widget stood.

A static page cannot run our widgets (they lay graphs out in the browser against a live kernel's model). Each widget
output carries its own static stand-in (HTML with the graph drawn by ``dot``), and the notebook carries megabytes of
saved widget state that only a live widget manager reads: the page keeps the stand-in and drops the state.
``docs/screenshots.py`` shoots the same widgets in a real JupyterLab and records which cell each picture belongs
to (``shots.json``); there the picture of the live widget replaces the stand-in. Everything else — reports, tables,
printed text — is the run's own output, untouched.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

WIDGET = "application/vnd.jupyter.widget-view+json"


def _static(output: dict[str, Any]) -> dict[str, Any]:
    """The output without its live-widget mimetype where it has a static stand-in to show instead."""
    data = output.get("data", {})
    if WIDGET in data and "text/html" in data:
        return {**output, "data": {k: v for k, v in data.items() if k != WIDGET}}
    return output


def _picture(image_url: str, alt: str) -> dict[str, Any]:
    img = f'<img src="{html.escape(image_url)}" alt="{html.escape(alt)}" loading="lazy">'
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": img, "text/plain": alt}}


def picture_widgets(notebook: dict[str, Any], shots: list[dict[str, Any]], images_url: str) -> dict[str, Any]:
    """A copy of ``notebook`` for a static page: no widget state, each widget shown by its picture or stand-in.

    ``images_url`` is where the page finds the images, relative to the page. Pictures are placed by cell; a cell
    with a shot but no widget output means the tutorial and the pictures disagree, and raises. A shot of static HTML
    (``"widget": false``, the "which strategy?" table) is left out: the page shows that HTML itself.
    """
    pictures = {shot["cell"]: shot for shot in shots if shot.get("widget", True)}
    cells = []
    for i, cell in enumerate(notebook["cells"]):
        outputs = cell.get("outputs")
        if outputs is None:
            cells.append(cell)
            continue
        shot = pictures.pop(i, None)
        if shot is not None and not any(WIDGET in o.get("data", {}) for o in outputs):
            raise ValueError(
                f"the tutorial's cell {i} has no widget output to picture with {shot['image']}: "
                "regenerate the pictures (python docs/screenshots.py)"
            )
        cells.append(
            {
                **cell,
                "outputs": [
                    _picture(f"{images_url}/{shot['image']}", shot["alt"])
                    if shot is not None and WIDGET in o.get("data", {})
                    else _static(o)
                    for o in outputs
                ],
            }
        )
    if pictures:
        raise ValueError(f"pictures for cells the tutorial does not have: {sorted(pictures)}")
    metadata = {k: v for k, v in notebook["metadata"].items() if k != "widgets"}
    return {**notebook, "metadata": metadata, "cells": cells}


def write_page(executed: Path, shots_file: Path, dest: Path, images_url: str = "../images") -> bool:
    """Write the tutorial page's notebook to ``dest``; returns whether it changed (``mkdocs serve`` watches it)."""
    notebook = json.loads(executed.read_text())
    shots = json.loads(shots_file.read_text()) if shots_file.exists() else []
    text = json.dumps(picture_widgets(notebook, shots, images_url), indent=1) + "\n"
    if dest.exists() and dest.read_text() == text:
        return False
    dest.write_text(text)
    return True

"""The documentation's pictures, taken from the real views: the tutorial run in a real JupyterLab in headless Chromium.

    .venv/bin/python docs/screenshots.py            # rewrites docs/images/*.png and docs/images/shots.json

Pictures typed by hand go stale the day a view changes; these are shot from the views a user sees after "Run All"
on the tutorial (real ranks, real traces), so rerunning this script is all it takes to bring them up to date. Each
picture is one widget at "fit" (or the tab a shot names), kept under ``MAX_BYTES``. ``shots.json`` records which
tutorial cell each picture shows, so the docs' tutorial page puts the picture where the live widget stood
(``docs/tutorial_page.py``). The browser test runs :func:`shoot` over its own notebook, so a change to the views
that breaks a shot fails the suite, not the next person who regenerates the pictures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout: tests.helpers is the browser driver
    sys.path.insert(0, str(REPO))

IMAGES = REPO / "docs" / "images"
TUTORIAL = REPO / "thunderviz" / "demos" / "tutorial.ipynb"
#: Each picture stays light enough for a README and a repository (the docs' own rule).
MAX_BYTES = 300_000
#: The browser window the pictures are taken in: a laptop's notebook width.
VIEWPORT = (1400, 1000)


@dataclass(frozen=True)
class Shot:
    """One picture: which widget output (by the tutorial cell that shows it) and what to click before shooting."""

    name: str
    cell: str  # a piece of source that names the tutorial cell whose output is pictured (exactly one cell has it)
    selector: str  # the widget's root element inside that cell's output
    alt: str  # what the picture shows, for the docs' alt text
    tab: str | None = None  # a tab of the trace view to open first (e.g. "memory")
    part: str | None = None  # a part of the widget to shoot instead of the whole (a CSS selector inside it)
    fit: bool = True  # press the view's "fit" first
    widget: bool = True  # a widget marks itself drawn; static HTML (a table) is shot as soon as it is there


SHOTS: tuple[Shot, ...] = (
    Shot(
        "trace-view",
        'TraceView(zero3, trace="backward")',
        ".tv-root[data-mode=trace]",
        "TraceView of the ZERO3 backward trace: blocks from the head down, each bucket's communication beside it",
    ),
    Shot(
        "compare-zero2-zero3",
        "thunderviz.compare(zero2, zero3",
        ".tv-root[data-mode=compare]",
        "thunderviz.compare(zero2, zero3): both backward traces on one scale, ZERO3's added all_gathers outlined",
    ),
    Shot(
        "timeline",
        "TimelineView(ddp_timed.timeline)",
        ".tl-root",
        "TimelineView: one lane per rank, compute by module, collectives and the time each rank waited",
        fit=False,
    ),
    Shot(
        "memory-plan",
        "TraceView(planned, plan=plan)",
        ".tv-root[data-mode=trace]",
        "The Memory tab: each candidate's predicted peak per rank against the budget, and the measured ranks",
        tab="memory",
        part=".tv-panel",
        fit=False,
    ),
    Shot(
        "which-strategy",
        "thunderviz.compare_runs(",
        ".thunderviz-strategies",
        "compare_runs: the tutorial's runs and the plan's candidates grouped by workload, against the budget",
        fit=False,
        widget=False,
    ),
)


def cell_index(notebook: dict[str, Any], piece: str) -> int:
    """The index of the one code cell whose source holds ``piece`` (a shot must name its cell unambiguously)."""
    found = [i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code" and piece in "".join(c["source"])]
    if len(found) != 1:
        raise SystemExit(f"screenshots: {len(found)} code cells of the tutorial hold {piece!r}; expected exactly 1")
    return found[0]


def png_facts(data: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values in the decoded image data (a blank picture has ~1)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def lighten(path: Path) -> None:
    """Rewrite a screenshot as a 256-colour PNG, undithered.

    Why: Chromium's PNGs are true-colour, and the tall compare view came out at 281 KB from the tutorial and 309 KB
    from the browser test's tour (over ``MAX_BYTES``); the views are flat fills and anti-aliased text in a few
    thousand colours, and the palette version is a third of the size (281 -> 97 KB) with no difference one can see.
    """
    from PIL import Image

    with Image.open(path) as picture:
        palette = picture.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(path, optimize=True)


def shoot(lab: Any, shot: Shot, cell: int, out: Path) -> Path:
    """Picture one widget output of cell ``cell`` (its index in the notebook) into ``out/<name>.png``.

    Raises when the widget is not drawn within a minute or the picture is over ``MAX_BYTES``.
    """
    page = lab.page
    output = page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea")
    drawn = "[data-drawn]" if shot.widget else ""  # the widgets mark themselves drawn
    root = output.locator(f"{shot.selector}{drawn}").first
    root.wait_for(timeout=60_000)
    root.scroll_into_view_if_needed()
    if shot.tab:
        root.locator(f"button.tv-tab[data-tab={shot.tab}]").click()
    if shot.fit:
        root.locator("button.tv-btn", has_text="fit").click()
    target = root.locator(shot.part).first if shot.part else root
    box = target.bounding_box()
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    if box is not None and box["height"] > height - 120:
        # JupyterLab scrolls the notebook inside the window: an element taller than the window comes out cut, so the
        # window grows to hold it (the notebook keeps its width, so the widget's layout does not change)
        page.set_viewport_size({"width": width, "height": int(box["height"]) + 240})
    target.scroll_into_view_if_needed()
    time.sleep(0.3)  # the fit and tab switches animate nothing, but layout settles a frame later
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{shot.name}.png"
    target.screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": height})
    lighten(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RuntimeError(f"{path.name} is {size / 1000:.0f} KB, over the {MAX_BYTES // 1000} KB the docs allow")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the PNGs and shots.json go")
    parser.add_argument("--timeout", type=float, default=900, help="seconds the tutorial may take to run")
    args = parser.parse_args(argv)

    from tests.helpers.jupyterlab import open_lab, run_all, wait_until_idle

    notebook = json.loads(TUTORIAL.read_text())
    cells = {shot.name: cell_index(notebook, shot.cell) for shot in SHOTS}
    with tempfile.TemporaryDirectory(prefix="thunderviz-shots-") as tmp:
        copy = Path(tmp) / "tutorial.ipynb"  # autosave writes outputs back: never into the package's copy
        shutil.copy(TUTORIAL, copy)
        t0 = time.monotonic()
        with open_lab(copy, viewport=VIEWPORT) as lab:
            run_all(lab)
            wait_until_idle(lab, args.timeout)
            print(f"screenshots: the tutorial ran in {time.monotonic() - t0:.0f} s")
            shots = []
            for shot in SHOTS:
                path = shoot(lab, shot, cells[shot.name], args.out)
                width, height, _ = png_facts(path.read_bytes())
                print(
                    f"  {path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {width}x{height}, "
                    f"{path.stat().st_size / 1000:.0f} KB"
                )
                shots.append({"image": path.name, "cell": cells[shot.name], "alt": shot.alt, "widget": shot.widget})
            if lab.errors:
                print("screenshots: the page logged errors:\n  " + "\n  ".join(lab.errors), file=sys.stderr)
                return 1
    (args.out / "shots.json").write_text(json.dumps(shots, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The documentation stays true to the code: the README short and pointing into the site, every picture there and
light, every bench command it quotes real, no paragraph in two places, the reference complete, and the getting-started
code that is marked runnable actually running.

The site's strict build (``mkdocs build --strict``: broken links, missing references, docstrings griffe cannot read)
needs the executed tutorial, so it runs where the suite already runs the tutorial: ``build_site`` is called by
``tests/demos/test_installed_demo.py`` on that run's output. Everything here reads files and costs under a second,
except the runnable blocks (a real 2-rank Fabric run of the quick start, under a minute).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
MAX_README_LINES = 150
MAX_IMAGE_BYTES = 300_000
#: The comment that marks the code block after it as one the suite runs (a whole script, CPU only).
RUNNABLE = "<!-- runnable -->"

sys.path.insert(0, str(DOCS))
import hooks  # noqa: E402 (docs/ is not a package)
import layout  # noqa: E402
import screenshots  # noqa: E402
from tutorial_page import WIDGET, picture_widgets  # noqa: E402


def _pages() -> dict[Path, str]:
    pages = {README: README.read_text()}
    pages.update({p: p.read_text() for p in sorted(DOCS.glob("*.md"))})
    return pages


def build_site(executed_tutorial: Path, site: Path) -> None:
    """``mkdocs build --strict`` into ``site`` with ``executed_tutorial`` as the tutorial page, then check that every
    public name has a rendered entry. Raises with mkdocs' own output when the build fails."""
    env = dict(os.environ, THUNDERVIZ_DOCS_TUTORIAL=str(executed_tutorial), NO_MKDOCS_2_WARNING="1")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    api = (site / "api" / "index.html").read_text()
    missing = [path for path in hooks.public_paths().values() if f'id="{path}"' not in api]
    assert not missing, f"public names without a rendered reference entry: {missing}"
    tutorial = (site / "tutorial" / "index.html").read_text()
    assert "Will it fit?" in tutorial and "<img" in tutorial, "the tutorial page lost its text or its pictures"


def test_the_readme_is_short_opens_with_a_picture_and_points_into_the_site() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    first_picture = next(i for i, line in enumerate(lines) if re.search(r"!\[[^\]]*\]\(docs/images/", line))
    assert first_picture < 12, f"the README's first picture is on line {first_picture + 1}"
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)(?:#[\w-]+)?\)", README.read_text()))
    assert len(linked) >= 6, f"the README links only {sorted(linked)} of the site's guides"
    assert all((REPO / page).is_file() for page in linked), sorted(p for p in linked if not (REPO / p).is_file())


def test_every_picture_the_docs_show_exists_is_light_and_is_shown() -> None:
    shown = set()
    for page, text in _pages().items():
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", text) + re.findall(r'<img src="([^"]+\.png)"', text):
            path = (page.parent / ref).resolve()
            assert path.is_file(), f"{page.name} shows {ref}, which does not exist"
            shown.add(path)
    shots = json.loads((DOCS / "images" / "shots.json").read_text())
    shown |= {(DOCS / "images" / s["image"]).resolve() for s in shots}
    for png in (DOCS / "images").glob("*.png"):
        assert png.resolve() in shown, f"{png.name} is shown nowhere: remove it or show it"
        assert png.stat().st_size <= MAX_IMAGE_BYTES, f"{png.name} is {png.stat().st_size} bytes"
        width, height, distinct = screenshots.png_facts(png.read_bytes())
        assert width >= 300 and height >= 150 and distinct > 16, f"{png.name}: {width}x{height}, looks blank"


def test_the_layout_picture_is_drawn_from_the_current_tree() -> None:
    """docs/architecture.md's layout picture: its DOT source, regenerated from the tree and the import rules, is the
    committed one (no graphviz needed here), and the SVG beside it shows every package."""
    committed = (DOCS / "images" / "layout.dot").read_text(encoding="utf-8")
    assert layout.dot_source() == committed, "the package layout changed: run python docs/layout.py"
    svg = (DOCS / "images" / "layout.svg").read_text(encoding="utf-8")
    packages = [p.name for p in sorted((REPO / "thunderviz").iterdir()) if (p / "__init__.py").is_file()]
    assert len(packages) >= 8 and all(f"{name}/" in svg for name in packages), packages
    assert "images/layout.svg" in (DOCS / "architecture.md").read_text()


def test_the_pictures_belong_to_the_tutorial_cells_they_stand_in() -> None:
    """Each shot names the tutorial cell by its source; the recorded index must still be that cell, and the cell must
    show a widget (else the tutorial moved on and the pictures must be taken again: python docs/screenshots.py)."""
    tutorial = json.loads(screenshots.TUTORIAL.read_text())
    shots = json.loads((DOCS / "images" / "shots.json").read_text())
    assert [(s["image"], s["widget"]) for s in shots] == [(f"{s.name}.png", s.widget) for s in screenshots.SHOTS]
    for recorded, shot in zip(shots, screenshots.SHOTS, strict=True):
        assert recorded["cell"] == screenshots.cell_index(tutorial, shot.cell), (recorded, shot.cell)
    # a cell that shows a widget when run gets its picture; on the unexecuted tutorial, a fake widget output stands in
    fake = json.loads(json.dumps(tutorial))
    for s in shots:
        fake["cells"][s["cell"]]["outputs"] = [{"output_type": "display_data", "data": {WIDGET: {}, "text/html": ""}}]
    page = picture_widgets(fake, shots, "../images")
    for s in shots:
        shown = page["cells"][s["cell"]]["outputs"][0]["data"]["text/html"]
        assert (s["image"] in shown) == s["widget"], s  # static HTML shows itself, a widget its picture


def test_every_bench_command_the_docs_quote_exists_with_its_flags() -> None:
    quoted = 0
    for page, text in _pages().items():
        for script, flags in re.findall(r"(bench/[\w./-]+\.(?:py|sh))((?:\s+--[\w-]+)*)", text):
            quoted += 1
            path = REPO / script
            assert path.is_file(), f"{page.name} quotes {script}, which does not exist"
            source = path.read_text()
            for flag in flags.split():
                assert re.search(rf"""["'\s]{re.escape(flag)}\b""", source), f"{page.name}: {script} has no {flag}"
    assert quoted >= 5, "the docs quote almost no benchmark: the numbers they give must name where they come from"


def _paragraphs(text: str) -> set[str]:
    """Prose paragraphs of a Markdown text (no code, tables, headings or lists' first lines), whitespace-normalized."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = set()
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(block.split())
        if len(block) >= 120 and not block.startswith(("|", "#", "<!--", "!")):
            out.add(block)
    return out


def test_no_paragraph_lives_in_two_places() -> None:
    seen: dict[str, Path] = {}
    for page, text in _pages().items():
        for para in _paragraphs(text):
            assert para not in seen, f"this paragraph is in both {seen[para].name} and {page.name}:\n{para[:200]}"
            seen[para] = page


def test_the_reference_lists_every_public_name_in_a_section() -> None:
    import thunderviz

    paths = hooks.public_paths()
    assert set(paths) == set(thunderviz.__all__)
    markdown = hooks.reference_markdown()
    assert all(f"::: {path}\n" in markdown for path in paths.values())
    assert "## More" not in markdown, "a public name is in no section of docs/hooks.py SECTIONS: place it"


def _runnable_blocks() -> list[tuple[str, str]]:
    text = (DOCS / "getting-started.md").read_text()
    text = re.sub(r'--8<-- "([^"]+)"', lambda m: _snippet(m.group(1)), text)
    blocks = re.findall(re.escape(RUNNABLE) + r"\s*```python\n(.*?)```", text, flags=re.S)
    return [(f"block {i + 1}", code) for i, code in enumerate(blocks)]


def _snippet(ref: str) -> str:
    """pymdownx.snippets' ``file:section`` include, as the site renders it."""
    name, _, section = ref.partition(":")
    text = (REPO / name).read_text()
    if not section:
        return text
    match = re.search(rf"--8<-- \[start:{section}\][^\n]*\n(.*?)\n[^\n]*--8<-- \[end:{section}\]", text, flags=re.S)
    assert match, f"{name} has no snippet section {section!r}"
    return match.group(1)


@pytest.mark.timeout(240)
def test_the_getting_started_code_marked_runnable_runs(tmp_path: Path) -> None:
    """Each runnable block is a whole script, run as a user would (``python script.py``), on CPU."""
    blocks = _runnable_blocks()
    assert blocks, f"docs/getting-started.md marks no code block runnable ({RUNNABLE} before a ```python block)"
    for name, code in blocks:
        script = tmp_path / f"{name.replace(' ', '_')}.py"
        script.write_text(code)
        env = dict(
            os.environ,
            PYTHONWARNINGS="ignore",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        )
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, (
            f"getting-started {name} failed:\n{code}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )

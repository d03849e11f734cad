"""``pip install .`` (not editable) into a fresh venv, then ``thunderviz demo``: the tutorial runs from the package.

This is the suite's one run of the tutorial (nbval runs its sequel, ``further.ipynb``; running the tutorial a second
time under nbval cost a minute of the suite for the same cells), so it carries every check on it: the report's
sections, the terminal story, and the executed notebook's outputs against the ones the shipped tutorial shows, as
nbval compares them (cells tagged ``nbval-ignore-output`` are skipped, the same sanitizing regexes).

Kept affordable: the fresh venv gets its dependencies (torch, thunder, jupyter, setuptools...) from this
environment through a ``.pth`` file instead of installing them, and ``pip install --no-deps --no-build-isolation``
builds and installs only thunderviz, offline. A ``.pth`` line adds a directory to ``sys.path`` without processing
the ``.pth`` files inside it, so an editable thunderviz installed here stays invisible to the fresh venv. The build
runs on a copy of the files a wheel is made from (no ``build/`` or ``*.egg-info`` left in the checkout), and the
demo runs from a temporary directory without ``PYTHONPATH``, so only the installed package can be imported.

Over a minute (about 80 s beside the other pytest worker): it is ``./run demo``'s whole tutorial, every cell on two
ranks, which the issue that made it the demo bounds at 2 minutes on its own.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The tutorial's named reports, in order. Sections added later (with their own --name) may come in between.
REPORTS = ["zero2", "zero3", "ddp", "ddp_timed", "planned"]


def _sanitize(text: str) -> str:
    """nbval's ``--nbval-sanitize-with tests/demos/nbval_sanitize.cfg``, applied to one output's text."""
    config = configparser.ConfigParser()
    config.read(REPO / "tests" / "demos" / "nbval_sanitize.cfg")
    for section in config.sections():
        text = re.sub(config[section]["regex"], config[section]["replace"], text)
    return text


def _compared_outputs(cell: dict) -> list[tuple[str, str]]:
    """What nbval compares of a code cell: each output's type and text (stdout; a result's or display's
    text/plain), sanitized. stderr is left out: ``thunderviz.plan``'s progress bar draws there."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream" and o.get("name") == "stderr":
            continue
        text = o.get("text") if o["output_type"] == "stream" else o.get("data", {}).get("text/plain", "")
        out.append((o["output_type"] + ("/" + o["name"] if "name" in o else ""), _sanitize("".join(text or ""))))
    return out


def _source_copy(dest: Path) -> Path:
    """What setuptools builds the wheel from: pyproject.toml, the readme it names, the package."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "thunderviz", dest / "thunderviz", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _fresh_venv(path: Path) -> tuple[Path, Path]:
    """A venv without pip whose ``sys.path`` ends with this environment's site-packages; returns (bin, purelib)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    bin_dir = path / ("Scripts" if os.name == "nt" else "bin")
    purelib = Path(
        subprocess.run(
            [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (purelib / "zz_shared_dependencies.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n", encoding="utf-8")
    return bin_dir, purelib


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "JUPYTER_PATH")}
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")  # no user-installed kernelspec can point elsewhere
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


@pytest.mark.timeout(1200)
def test_pip_install_then_thunderviz_demo_runs_the_packaged_tutorial(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    bin_dir, purelib = _fresh_venv(tmp_path / "venv")
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--ignore-installed", str(_source_copy(tmp_path / "src"))]
    installed = subprocess.run(pip, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # a real (non-editable) install, with the package data
    package = purelib / "thunderviz"
    assert (package / "demos" / "tutorial.ipynb").is_file() and (package / "notebook" / "static").is_dir()
    assert (package / "demos" / "further.ipynb").is_file()
    assert not list(purelib.glob("__editable__*thunderviz*"))

    out = (tmp_path / "demo-output").resolve()
    out.mkdir()
    (out / "tutorial.ipynb").write_text("my edited copy", encoding="utf-8")  # the demo must keep it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    demo = subprocess.run(
        [str(bin_dir / "thunderviz"), "demo", "--out", str(out)],
        env=env,
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]

    # the kernel (and so its ranks) imported the installed package
    executed = json.loads((out / "tutorial.executed.ipynb").read_text(encoding="utf-8"))
    printed = "".join(
        "".join(o.get("text", "")) for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
    )
    assert f"kernel imported thunderviz from {package / '__init__.py'}" in printed
    # every cell whose output the shipped tutorial shows printed the same (what nbval would compare)
    shipped = json.loads((REPO / "thunderviz" / "demos" / "tutorial.ipynb").read_text())["cells"]
    ran = executed["cells"][: len(shipped)]
    compared = 0
    for i, (want, got) in enumerate(zip(shipped, ran, strict=True)):
        if want["cell_type"] != "code" or "nbval-ignore-output" in want.get("metadata", {}).get("tags", []):
            continue
        assert _compared_outputs(got) == _compared_outputs(want), f"tutorial cell {i}: {''.join(want['source'])}"
        compared += 1
    assert compared >= 5

    # the terminal story names each report once, in the tutorial's order
    story = demo.stdout
    names = re.findall(r"^\[(\w+)\]", story, re.M)
    assert len(names) == len(set(names)) and [n for n in names if n in REPORTS] == REPORTS

    # one offline page with every report the tutorial named
    report = out / "thunderviz-demo.html"
    assert sorted(p.name for p in out.glob("*.html")) == [report.name]
    page = report.read_text(encoding="utf-8")
    for name in names:
        assert f"<h2>{name}</h2>" in page
    assert page.count("<section id='run-") == len(names)  # named reports only (not IPython's _, __ output history)
    # contents first, linking every section and the two summaries; then the "which strategy?" table of the cells
    # that trained
    strategies = "<h4 id='which-strategy'>Which strategy?</h4>"
    assert page.index("<h2>Contents</h2>") < page.index(strategies) < page.index("<section ")
    assert all(f"href='#run-{i}'>{n}</a>" in page for i, n in enumerate(names))
    assert (
        "<a href='#which-strategy'>Which strategy?</a>" in page and "<a href='#runs-compared'>Runs compared</a>" in page
    )
    assert re.search(r"<td>zero2</td><td>measured</td><td>thunder_fsdp \(FSDP ZERO2", page)
    assert re.search(r"<td>zero3</td><td>measured</td><td>thunder_fsdp \(FSDP ZERO3", page)
    assert "TinyGPT" in page
    # the runs compared, as the compare view's header says it, before the sections (the page had none)
    assert page.index(strategies) < page.index("<h2 id='runs-compared'>Runs compared</h2>") < page.index("<section id=")
    assert re.search(r"<h3>zero2 against zero3 \(\w+\)</h3><p>zero3 sends [\d.]+x zero2&#x27;s bytes per step", page)
    assert "changed: ops" in page and "only in zero3" in page
    assert len(page.encode()) < 2 * 2**20  # the size budget for the tutorial's page (3.9 MB before)
    assert not re.search(r"""(src|href)=["']?https?://""", page)  # offline: nothing fetched from the network
    _check_the_plan_is_drawn(executed["cells"], page)
    _check_every_view_says_the_same_numbers(executed["cells"], page)
    _check_the_words_match_what_is_drawn(executed["cells"])
    _check_the_chips_and_the_header_agree(executed["cells"], page)

    # the terminal story: each cell's decisions and rank 0's collectives, then where everything is
    assert "running tutorial.ipynb headlessly on 2 CPU ranks" in story
    assert "[zero2] thunder_fsdp on 2 ranks (gloo)" in story
    # one-line decision headlines; the 4-block tutorial model gets a bucket per block
    assert "\n  case 1: jit once, then shard - ZERO2, 4 block buckets + root\n" in story
    assert "\n  case 1: jit once, then shard - ZERO3, 4 block buckets + root\n" in story
    assert "\n  executors: sdpa, torchcompile_xentropy (thunder's defaults on CPU: they compile fastest)\n" in story
    assert "\n  case 1: jit once, then replicate - 25 MB gradient buckets\n" in story
    assert "a plain nn.Module and jit=True" not in story  # the reasoning is in the report, not the story
    assert re.search(r"\d+ all_gather, \d+ reduce_scatter, \d+ wait; ranks agree", story)
    assert re.search(r"\d+ all_reduce, \d+ wait; ranks agree", story)
    assert "MISMATCH" not in story and "problem:" not in story
    # the timeline section: the DDP model's steps, recorded on every rank, with the analysis in the story
    assert re.search(r"^\[ddp_timed\] thunder_ddp.*(\n  .*)*\n  timeline: ", story, re.M)
    assert "<h4>Timeline: thunder_ddp (2 ranks, 4 steps)</h4>" in page and "<svg" in page
    assert f"report: {report}" in story
    assert f"work through the tutorial yourself: jupyter lab --ip=127.0.0.1 {out / 'tutorial.ipynb'}" in story
    assert (out / "tutorial.ipynb").read_text(encoding="utf-8") == "my edited copy"
    assert "thunderviz, further" in (out / "further.ipynb").read_text(encoding="utf-8")  # the sequel, clean

    # the documentation site builds from this run's executed tutorial: mkdocs build --strict, offline
    from tests.test_docs import build_site

    build_site(out / "tutorial.executed.ipynb", tmp_path / "site")
    # the tutorial's last section, the "which strategy?" table, drawn with this run's reports
    which = next(c for c in executed["cells"] if c.get("id") == "which-strategy")
    html = "".join(next(o["data"]["text/html"] for o in which["outputs"] if o["output_type"] == "execute_result"))
    assert "<div class='thunderviz-strategies'>" in html and "ddp_timed" in html and "fsdp-zero2-block" in html


def _check_the_plan_is_drawn(cells: list[dict], page: str) -> None:
    """The tutorial printed the plan's table only; why DDP was not run never showed. Now the plan shows as
    bars (each candidate against the budget line), the TraceView its markdown names is displayed, and the planned
    run's section of the page draws the plan with its ranks measured under their own candidate; no bar's total
    sits across the budget line."""
    by_id = {c.get("id"): c for c in cells}
    shown = next(o for o in by_id["plan-make"]["outputs"] if o["output_type"] == "execute_result")["data"]
    assert "ddp x2 \u2717" in "".join(shown["text/html"]) and "class='tv-budget'" in "".join(shown["text/html"])
    assert any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in by_id["plan-traceview"]["outputs"]
    )
    section = page[page.index("<h2>planned</h2>") :]
    memory = section[section.index("<h4>Memory per rank") :]
    svg = memory[: memory.index("</svg>")]
    texts = re.findall(r"<text x='([0-9.]+)' y='[0-9]+'>([^<]*)</text>", svg)
    sizes = [(float(x), t) for x, t in texts if re.fullmatch(r"[0-9.]+ (B|KiB|MiB)", t)]
    labels = [t.rstrip(" \u2713\u2717") for x, t in texts if float(x) == 0]
    assert labels == ["ddp x2", "fsdp-zero2-block x2", "\u2514 rank 0, measured", "\u2514 rank 1, measured"], labels
    assert "<text x='0' y='35'>ddp x2 \u2717</text>" in svg and "(ddp x2 over it)" in memory
    line = float(re.search(r"class='tv-budget' x1='([0-9.]+)'", svg).group(1))
    assert len(sizes) == 4 and all(not x - 2 < line < x + 6.4 * len(t) + 2 for x, t in sizes), (line, sizes)
    assert "with its plan: 2 candidates against the budget, 1 over it" in page  # the contents line says so


def _check_the_words_match_what_is_drawn(cells: list[dict]) -> None:
    """The compare view stacks its panes at a notebook's width, so the tutorial names a run's pane, never its side
    ("red on the left and green on the right"); and no cell ends with an empty stderr block (the plan's progress bar
    sent its closing newline after the table the cell printed)."""
    words = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert not re.search(r"\bon the (left|right)\b", words)
    for cell in cells:
        blocks: list[list[str]] = []  # [stream name, text]: consecutive outputs of one stream show as one block
        for o in cell.get("outputs", []):
            if o["output_type"] != "stream":
                blocks.append(["", "(not a stream)"])
            elif blocks and blocks[-1][0] == o["name"]:
                blocks[-1][1] += "".join(o["text"])
            else:
                blocks.append([o["name"], "".join(o["text"])])
        assert all(text.strip() for _name, text in blocks), (cell.get("id"), blocks)


def _check_the_chips_and_the_header_agree(cells: list[dict], page: str) -> None:
    """The first cell's chips said 20.1 s and its header 13.61 s; both now say the same split."""
    header = re.search(r"<h3>zero2: [^<]*, gloo: ([^<]*)</h3>", page).group(1)
    assert header.endswith(" s starting the pool"), header  # the first cell started the pool
    status = [
        "".join(o["data"]["text/html"])
        for c in cells
        if "--name zero2" in "".join(c["source"])
        for o in c.get("outputs", [])
        if "thunderviz-status" in "".join(o.get("data", {}).get("text/html", ""))
    ]
    assert len(status) == 1 and f"the cell: {header}" in status[0], (header, status)


def _check_every_view_says_the_same_numbers(cells: list[dict], page: str) -> None:
    """One number per fact across the tutorial's views: a run's bytes per step, step peak and its parts, and step
    time are the same in the "which strategy?" table, the run's section, the verdicts and the plan's table; the
    central ZERO2 / ZERO3 / DDP comparison is measured and ranked with the plan's candidates against its budget;
    nothing contradicts the plan's recommendation (ZERO2 BLOCK fits, DDP with AdamW does not). Before: three answers
    for ZERO2's bytes, three of five rows "not measured", two rows "the leanest", DDP with SGD the page's pick."""
    from tests.helpers.view_numbers import assert_page_agrees, page_numbers

    numbers = page_numbers(page)
    assert assert_page_agrees(numbers) >= 12
    table = numbers.table
    for run in ("zero2", "zero3", "ddp", "planned", "ddp_timed"):
        assert re.fullmatch(r"[0-9.]+ (KiB|MiB) \((steps? [0-9-]+)\)", table[run]["peak per rank"]), table[run]
    # one workload, so one group: the central runs, the planned one and the plan's candidates, against its budget
    outputs = next(c for c in cells if c.get("id") == "plan-make")["outputs"]
    plan_text = "".join(next(o["text"] for o in outputs if o.get("name") == "stdout"))
    budget = re.search(r"budget per rank: ([0-9.]+ \w+)", plan_text)[1]
    assert numbers.budget == budget
    for candidate in ("ddp", "fsdp-zero2-block"):
        line = re.search(rf"{candidate} x2: peak (\S+ \w+) \(([^)]*)\), sends (\S+ \w+)", plan_text)
        row = table[f"{candidate} (plan)"]
        assert (row["peak per rank"], row["sent per step per rank"]) == (line[1], line[3]), (row, line[0])
        assert row["fits"] == ("yes" if line[2] == "fits" else "no")
    # each candidate's parts: the plan's own picture, the planned run's memory section and the table draw one account
    from tests.helpers.view_numbers import bar_parts

    picture = "".join(next(o["data"]["text/html"] for o in outputs if o["output_type"] == "execute_result"))
    section = page[page.index("<h2>planned</h2>") :]
    section = section[section.index("<h4>Memory per rank") :]
    in_plan, in_section = bar_parts(picture), bar_parts(section[: section.index("</svg>")])
    for candidate in ("ddp", "fsdp-zero2-block"):
        drawn = numbers.table_bars[f"{candidate} (plan) x2"]
        assert drawn == in_plan[f"{candidate} x2"] == in_section[f"{candidate} x2"], (drawn, in_plan, in_section)
    for run in ("zero2", "zero3", "ddp", "planned"):
        assert table[run]["fits"] in ("yes", "no"), table[run]
    assert table["ddp"]["fits"] == "no" and table["zero2"]["fits"] == table["planned"]["fits"] == "yes"
    assert table["zero2"]["sent per step per rank"] == table["ddp"]["sent per step per rank"]  # ring: ZERO2 = DDP
    groups = re.split(r"<h5>", page[page.index("Which strategy?") : page.index("<h2 id='runs-compared'>")])[1:]
    assert len(groups) == 2, len(groups)  # AdamW runs with the plan, and the SGD run alone
    assert [sum(1 for r in table_rows if "the leanest" in r["why"]) for table_rows in map(_rows, groups)] == [1, 0]
    assert "compared with no other run: SGD instead of AdamW" in groups[1]
    # pairs of one workload under different strategies; the tutorial's own DDP against ZERO2 among them
    assert set(numbers.verdicts) == {("zero2", "zero3"), ("zero2", "ddp"), ("zero3", "ddp")}, numbers.verdicts
    # the timed cell: the step time from steps timed with the profiler stopped, memory on a step no timer saw
    timed = numbers.runs["ddp_timed"]
    assert timed.step_time.endswith("(steps 7-8)") and timed.memory_steps == "step 9", timed
    assert "unprofiled" in table["ddp_timed"]["step"]


def _rows(fragment: str) -> list[dict[str, str]]:
    from tests.helpers.view_numbers import table_rows

    return table_rows(fragment)

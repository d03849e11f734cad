"""``pip install .`` (not editable) into a fresh venv, then ``thunderviz demo``: the tutorial runs from the package.

This is the suite's one run of the whole demo (nbval runs the tutorial itself separately, cell by cell), so it
also carries every check on the demo's output: the report's sections, the terminal story, the executed notebook.

Kept affordable: the fresh venv gets its dependencies (torch, thunder, jupyter, setuptools...) from this
environment through a ``.pth`` file instead of installing them, and ``pip install --no-deps --no-build-isolation``
builds and installs only thunderviz, offline. A ``.pth`` line adds a directory to ``sys.path`` without processing
the ``.pth`` files inside it, so an editable thunderviz installed here stays invisible to the fresh venv. The build
runs on a copy of the files a wheel is made from (no ``build/`` or ``*.egg-info`` left in the checkout), and the
demo runs from a temporary directory without ``PYTHONPATH``, so only the installed package can be imported.
"""

from __future__ import annotations

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
    # contents first, linking every section; then the "which strategy?" table of the cells that trained
    assert page.index("<h2>Contents</h2>") < page.index("<h4>Which strategy?</h4>") < page.index("<section ")
    assert all(f"href='#run-{i}'>{n}</a>" in page for i, n in enumerate(names))
    assert re.search(r"<td>zero2</td><td>measured</td><td>thunder_fsdp \(FSDP ZERO2", page)
    assert re.search(r"<td>zero3</td><td>measured</td><td>thunder_fsdp \(FSDP ZERO3", page)
    assert "TinyGPT" in page
    assert not re.search(r"""(src|href)=["']?https?://""", page)  # offline: nothing fetched from the network

    # the terminal story: each cell's decisions and rank 0's collectives, then where everything is
    assert "running tutorial.ipynb headlessly on 2 CPU ranks" in story
    assert "[zero2] thunder_fsdp on 2 ranks (gloo)" in story
    # one-line decision headlines (issue 19); the 4-block tutorial model gets a bucket per block
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

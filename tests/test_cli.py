"""The ``thunderviz`` command line: ``render`` end to end on saved files, its errors, and what it imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.fresh_interpreter import CLUSTER, HEAVY, NOTEBOOK, light_paths, present
from tests.helpers.small_traces import write_rank_files
from thunderviz.cli import build_parser, main


def test_render_writes_one_offline_page_for_all_rank_files(tmp_path: Path, capsys) -> None:
    files = write_rank_files(tmp_path)
    out = tmp_path / "site" / "report.html"
    assert main(["render", *map(str, files), "--out", str(out), "--title", "two <ranks>", "--no-svg"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (2 traces, ")
    page = out.read_text(encoding="utf-8")
    assert "<title>two &lt;ranks&gt;</title>" in page and "two <ranks>" not in page
    assert page.count("reduce_scatter") >= 2 and "TinyLinear" in page
    assert "<svg" not in page  # --no-svg: DOT source only


def test_render_names_a_missing_or_foreign_file_and_exits_1(tmp_path: Path, capsys) -> None:
    missing, out = tmp_path / "nope.json", tmp_path / "r.html"
    assert main(["render", str(missing), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("thunderviz render: load(") and "nope.json" in err and "cannot read the file" in err
    foreign = tmp_path / "other.json"
    foreign.write_text('{"hello": 1}', encoding="utf-8")
    assert main(["render", str(foreign), "--out", str(out)]) == 1
    assert "other.json" in capsys.readouterr().err
    assert not out.exists()


def test_demo_rejects_a_rank_count_below_one(capsys) -> None:
    assert main(["demo", "--scenarios", "--nproc", "0"]) == 2
    assert "--nproc must be at least 1, got 0" in capsys.readouterr().err


def test_every_subcommand_has_help() -> None:
    parser = build_parser()
    for command in ("render", "demo"):
        assert parser.parse_args([command, "x"] if command == "render" else [command]).command == command
    usage = subprocess.run(
        [sys.executable, "-m", "thunderviz.cli", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "render" in usage and "demo" in usage


def test_render_imports_neither_torch_nor_lightning_nor_thunder() -> None:
    """What keeps ``thunderviz render`` fast (bench/cli_start.py): only the trace model and the renderer load."""
    run = light_paths()  # `main(['render', two rank files, '--out', ...]) == 0` in a fresh interpreter
    assert present(run.loaded["thunderviz render"], HEAVY, NOTEBOOK, CLUSTER) == []
    assert run.rendered.stat().st_size > 0

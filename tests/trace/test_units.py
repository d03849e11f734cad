"""The one byte formatter (``trace.units``): what graphs, reports and diffs print for a size.

Its exact texts for every magnitude are checked in ``tests/render/test_graph.py`` (through the name ``render.graph``
re-exports); here what the callers rely on besides.
"""

from __future__ import annotations

from thunderviz.render import graph
from thunderviz.trace.units import format_bytes


def test_graphs_reports_and_diffs_share_one_formatter():
    assert graph.format_bytes is format_bytes


def test_an_unknown_size_reads_as_the_caller_says():
    assert format_bytes(None) == "n/a"
    assert format_bytes(None, unknown="-") == "-"  # a table cell: the run report's memory table


def test_halves_round_up_as_integer_arithmetic_does():
    assert format_bytes(1280) == "1.3 KiB"  # 1.25 KiB exactly; float formatting would print 1.2
    assert format_bytes(2**20) == "1.0 MiB"

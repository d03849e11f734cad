"""The cell report's compile line (issue 29): one line when ranks did alike, per rank otherwise."""

from __future__ import annotations

from thunderviz.ranks.report import compile_summary


def test_the_compile_line_says_once_what_every_rank_did_alike_and_per_rank_otherwise() -> None:
    alike = compile_summary({0: ["interpreted in 6.7 s"], 1: ["interpreted in 6.9 s"]})
    assert alike == "interpreted in 6.7 s (rank 0; every rank alike)"
    differ = compile_summary({0: ["interpreted in 6.7 s"], 1: ["reused an earlier set-up's trace (...)"]})
    assert differ == "rank 0: interpreted in 6.7 s; rank 1: reused an earlier set-up's trace (...)"
    assert compile_summary({}) == ""

"""The cell report's compile line: one line when ranks did alike, per rank otherwise."""

from __future__ import annotations

from thunderviz.reports.run_report import compile_summary


def test_the_compile_line_says_once_what_every_rank_did_alike_and_per_rank_otherwise() -> None:
    alike = compile_summary({0: ["interpreted in 6.7 s"], 1: ["interpreted in 6.9 s"]})
    assert alike == "interpreted in 6.7 s (rank 0; every rank alike)"
    differ = compile_summary({0: ["interpreted in 6.7 s"], 1: ["reused an earlier set-up's trace (...)"]})
    assert differ == "rank 0: interpreted in 6.7 s; rank 1: reused an earlier set-up's trace (...)"
    assert compile_summary({}) == ""


def test_where_the_seconds_went_does_not_split_ranks_that_compiled_alike() -> None:
    """The split is sampled: a part under 0.05 s on one rank may be missing on another, and the ranks still did alike
    (a 2-rank cell read "rank 0: ...; rank 1: ..." for one story)."""
    alike = compile_summary(
        {
            0: ["interpreted in 0.7 s", "of this rank's 0.9 s: thunder's interpreter 0.6 s, the rest 0.1 s"],
            1: ["interpreted in 0.7 s", "of this rank's 0.9 s: thunder's interpreter 0.6 s"],
        }
    )
    said = "of this rank's 0.9 s: thunder's interpreter 0.6 s, the rest 0.1 s"
    assert alike == f"interpreted in 0.7 s; {said} (rank 0; every rank alike)"

"""Every number a page of run reports shows, read back from the HTML as a reader sees it, and the check that two views
showing the same fact show the same number.

A page (``thunderviz demo``'s, or ``reports_page`` with the "which strategy?" table and "Runs compared" on top) draws
one run's facts several times: the strategy table's row and bar, the run's own section (its memory table, its bars,
its ledgers, the line saying which steps were measured), and each comparison's verdict. The facts are read as text
(``774.6 KiB``), the precision a reader compares them at; a test that recomputed them from the objects would agree
with itself whatever the views drew.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

__all__ = ["PageNumbers", "RunNumbers", "assert_page_agrees", "bar_parts", "page_numbers", "table_rows"]

_SIZE = r"[0-9.]+ (?:B|KiB|MiB|GiB)"


def table_rows(fragment: str) -> list[dict[str, str]]:
    """The first table of ``fragment`` as dicts by header (cells unescaped)."""
    m = re.search(r"<table><thead><tr>(.*?)</tr></thead><tbody>(.*?)</tbody></table>", fragment, re.S)
    if m is None:
        return []
    heads = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", m[1])]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", m[2], re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        rows.append(dict(zip(heads, cells, strict=False)))
    return rows


def bar_parts(svg: str) -> dict[str, dict[str, str]]:
    """Each stacked bar of a memory picture: its label (without the fits mark) -> part -> size as drawn."""
    out: dict[str, dict[str, str]] = {}
    label = None
    for m in re.finditer(r"<text x='0' y='[0-9.]+'>([^<]*)</text>|<title>([^<:]*): ([^<]*)</title>", svg):
        if m[1] is not None:
            label = html.unescape(m[1]).rstrip(" \u2713\u2717")
            out[label] = {}
        elif label is not None:
            out[label][html.unescape(m[2])] = m[3]
    return out


@dataclass
class RunNumbers:
    """What one run's own section shows: each rank's measured step peak, the parts of each measured rank's bar, what
    each rank's ledger says it sends per step, the step time line."""

    peaks: dict[int, str] = field(default_factory=dict)
    parts: dict[int, dict[str, str]] = field(default_factory=dict)
    sent: dict[int, str] = field(default_factory=dict)
    step_time: str = ""
    memory_steps: str = ""


@dataclass
class PageNumbers:
    """A page's numbers: the strategy table's rows (by row name) and bars, each run section's, each verdict's."""

    table: dict[str, dict[str, str]]
    table_bars: dict[str, dict[str, str]]
    runs: dict[str, RunNumbers]
    verdicts: dict[tuple[str, str], str]
    budget: str


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"<section id='run-\d+'><h2>", page)[1:]
    return {html.unescape(p[: p.index("</h2>")]): p for p in parts}


def _run_numbers(section: str) -> RunNumbers:
    out = RunNumbers()
    memory = section[section.index("<h4>Memory per rank") :] if "<h4>Memory per rank" in section else ""
    for row in table_rows(memory):
        if re.fullmatch(_SIZE, row.get("step peak, measured", "")):
            out.peaks[int(row["rank"])] = row["step peak, measured"]
            out.memory_steps = row["measured with"].partition(", ")[2]
    svg = memory[: memory.index("</svg>")] if "</svg>" in memory else ""
    for label, parts in bar_parts(svg).items():
        m = re.search(r"rank (\d+)(?:, measured| \(measured)", label)
        if m:
            out.parts[int(m[1])] = parts
    ledgers = re.findall(rf"Collectives ledger, rank (\d+): [^<]*?, ({_SIZE}) sent per step", section)
    if len({rank for rank, _ in ledgers}) == len(ledgers):  # one traced object: each rank's ledger is its step
        out.sent = {int(rank): sent for rank, sent in ledgers}
    observed = re.search(r"<p class='observed'>(.*?)</p>", section, re.S)
    if observed:
        said = html.unescape(observed[1])
        m = re.search(r"step time ([0-9.]+ ms), the median over (steps? [0-9, -]+?) of", said)
        out.step_time = f"{m[1]} ({m[2]})" if m else ""
        m = re.search(r"memory measured on (steps? [0-9, -]+?) \(", said)
        assert m is None or m[1] == out.memory_steps, (said, out.memory_steps)  # the line and the table agree
    return out


def page_numbers(page: str) -> PageNumbers:
    """Read every number ``assert_page_agrees`` compares off a page."""
    head = page.split("<section id='run-", 1)[0]
    strategies = head[head.index("Which strategy?") :] if "Which strategy?" in head else ""
    table: dict[str, dict[str, str]] = {}
    bars: dict[str, dict[str, str]] = {}
    for group in re.split(r"<h5>", strategies)[1:] or [strategies]:  # one table when the page draws no groups
        for row in table_rows(group):
            table[row["run"]] = row
        svg = group[: group.index("</svg>")] if "</svg>" in group else ""
        bars.update(bar_parts(svg))
    budget = re.search(r"budget per rank: ([^.<]*(?:\.\d [A-Za-z]+)?)\.</p>", strategies)
    verdicts = {}
    for a, b, said in re.findall(r"<h3>(.*?) against (.*?) \([^)]*\)</h3><p>(.*?)</p>", head, re.S):
        verdicts[html.unescape(a), html.unescape(b)] = html.unescape(said)
    return PageNumbers(
        table=table,
        table_bars=bars,
        runs={name: _run_numbers(section) for name, section in _sections(page).items()},
        verdicts=verdicts,
        budget=budget[1] if budget else "",
    )


def verdict_bytes(said: str, a: str, b: str) -> tuple[str, str]:
    """What a verdict says ``a`` and ``b`` send per step (``b sends 1.5x a's bytes per step (X -> Y)``, ``b sends the
    same bytes per step as a (X)``)."""
    m = re.search(rf"\(({_SIZE}) -> ({_SIZE})\)", said)
    if m:
        return m[1], m[2]
    m = re.search(rf"sends the same bytes per step as {re.escape(a)} \(({_SIZE})\)", said)
    assert m, said
    return m[1], m[1]


def verdict_peaks(said: str) -> str | None:
    """The signed step-peak difference a verdict ends with (``step peak (measured) −1.0 KiB``), if it has one."""
    m = re.search(r"step peak \(measured\) (the same|[+\u2212][0-9.]+ (?:B|KiB|MiB|GiB))$", said)
    return m[1] if m else None


def _bytes(text: str) -> float:
    n, unit = text.split()
    return float(n) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def assert_page_agrees(numbers: PageNumbers) -> int:
    """Every fact two views of the page both show is the same number; returns how many comparisons were made.

    Per measured run: the table's peak is the largest rank's measured peak in its section, the table bar's parts
    are that rank's bar's parts, and no part exceeds its whole; the table's bytes per step are what the busiest
    rank's ledger says; the table's step time is the section's. Per verdict: the bytes it gives each run are the
    table's.
    """
    checked = 0
    for name, run in numbers.runs.items():
        row = numbers.table.get(name)
        if row is None or row.get("from") != "measured":
            continue
        if run.peaks:
            largest = max(sorted(run.peaks), key=lambda r: _bytes(run.peaks[r]))
            peak = row["peak per rank"].split(" (")[0]
            assert peak == run.peaks[largest], (name, row, run.peaks)
            bar = numbers.table_bars[f"{name} x{row['ranks']}"]
            assert bar == run.parts[largest], (name, bar, run.parts)
            assert all(_bytes(v) <= _bytes(peak) for v in bar.values()), (name, bar, peak)  # no part over its whole
            if run.memory_steps:
                assert f"({run.memory_steps})" in row["peak per rank"], (name, row, run.memory_steps)
            checked += 3
        if run.sent:
            assert row["sent per step per rank"] == max(run.sent.values(), key=_bytes), (name, row, run.sent)
            checked += 1
        if run.step_time:
            assert row["step"].startswith(run.step_time.split(" (")[0]), (name, row, run.step_time)
            assert run.step_time.split(" (")[1].rstrip(")") in row["step"], (name, row, run.step_time)
            checked += 1
    for (a, b), said in numbers.verdicts.items():
        sent_a, sent_b = verdict_bytes(said, a, b)
        assert (sent_a, sent_b) == (
            numbers.table[a]["sent per step per rank"],
            numbers.table[b]["sent per step per rank"],
        ), (a, b, said)
        checked += 1
    return checked

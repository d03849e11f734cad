"""Reading timeline files (``load``): untrusted JSON in, ``RankTimeline`` objects out.

A timeline file comes from another rank, another machine or another person, like a trace file, so it goes through
the same gate, ``trace.validate``: a size cap before parsing, strict JSON (no ``NaN``, no duplicate keys, bounded
nesting and strings), the ``{"format", "version"}`` header, and typed fields whose errors name their place
(``ranks[0].collectives[3].start``). This module adds what is particular to timelines: finite numbers, intervals
that do not end before they start, a rank within its world, op columns of one length. Every failure becomes a
``TraceFormatError`` that names the file and the field, whatever the file holds.

The op table of a long recording has ~100k rows per rank: its columns are checked in one pass each, and a ``Node``
(the slow, located path) is made only to name a bad element.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from thunderviz.errors import TraceFormatError
from thunderviz.timeline.clock import ClockEstimate
from thunderviz.timeline.model import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CollectiveEvent,
    OpTable,
    RankTimeline,
    Region,
    Segment,
    Timeline,
)
from thunderviz.trace.validate import (
    DEFAULT_LIMITS,
    Invalid,
    Node,
    TooLarge,
    WrongVersion,
    check_envelope,
    read_json_file,
)

__all__ = ["load", "read_timeline_file"]

#: The format nests six deep (document, ranks, a rank, ops, a column, a value); anything deeper is not a timeline.
LIMITS = dataclasses.replace(DEFAULT_LIMITS, max_depth=8)
_FIX = "pass a file written by thunderviz.timeline.model.save or Timeline.save"


def read_timeline_file(path: str | os.PathLike[str]) -> tuple[str, list[str], list[RankTimeline]]:
    """``(name, problems, rank timelines)`` of one file.

    Raises:
        TraceFormatError: the file is missing, too large, not JSON, not a timeline, from another version, or has
            a malformed field; the message names the file and the field.
    """
    where = os.fsdecode(path)
    try:
        try:
            doc = read_json_file(where, LIMITS)
        except Invalid:
            raise
        except (OSError, ValueError) as e:  # ValueError: a path with a NUL byte
            raise _error(where, f"cannot read the file ({getattr(e, 'strerror', None) or e})") from e
        check_envelope(doc, FORMAT_NAME, FORMAT_VERSION)
        name = doc.str_or("name", "")
        problems = [p.string() for p in doc.opt_list("problems")]
        ranks = [_rank_from(r) for r in doc.req_list("ranks")]
    except TooLarge as e:
        raise _error(where, e.problem) from None
    except WrongVersion as e:
        raise _error(
            where,
            f"timeline {e.problem}",
            "record it again with this version, or open it with the thunderviz that wrote it",
        ) from None
    except Invalid as e:
        raise _error(where, e.problem, field=e.path) from None
    except (MemoryError, RecursionError) as e:
        raise _error(where, f"too large or too deeply nested to read ({type(e).__name__})") from None
    return name, problems, ranks


def _error(where: str, what: str, fix: str = _FIX, field: str = "") -> TraceFormatError:
    """As trace files word it: ``load('r1.json'): ranks[0].steps[0]: the field 'step' is missing; <fix>.``"""
    err = TraceFormatError(f"load({where!r}): {field + ': ' if field else ''}{what}; {fix}.")
    err.file, err.field = where, field  # type: ignore[attr-defined]
    return err


# ------------------------------------------------------------------------------------------------------------ fields


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(n: Node) -> float:
    if not _finite(n.value):
        n.fail(f"expected a finite number, found {_shown(n.value)}")
    return float(n.value)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _req_num(n: Node, key: str) -> float:
    v = n.obj().get(key)
    return float(v) if _finite(v) else _number(n[key])


def _opt_num(n: Node, key: str) -> float | None:
    child = n.get(key)
    return None if child is None else _number(child)


def _num_or(n: Node, key: str, default: float) -> float:
    v = _opt_num(n, key)
    return default if v is None else v


def _bool_or(n: Node, key: str, default: bool) -> bool:
    child = n.get(key)
    return default if child is None else child.boolean()


def _interval(n: Node, start: str = "start", end: str = "end") -> tuple[float, float]:
    a, b = _req_num(n, start), _req_num(n, end)
    if b < a:
        n[end].fail(f"{b} is before {start} ({a})")
    return a, b


def _numbers(n: Node, *, minimum: float | None = None) -> list[float]:
    """A list of finite numbers (one pass; a located error only for a bad element)."""
    v = n.value
    if isinstance(v, list) and all(_finite(x) and (minimum is None or x >= minimum) for x in v):
        return [float(x) for x in v]
    out = []
    for item in n.items():
        x = _number(item)
        if minimum is not None and x < minimum:
            item.fail(f"{x} is below the minimum of {minimum}")
        out.append(x)
    return out


# ------------------------------------------------------------------------------------------------------------ objects


def _region_from(n: Node) -> Region:
    a, b = _interval(n)
    return Region(kind=n.req_str("kind"), start=a, end=b, step=n.req_int("step"), name=n.str_or("name", ""))


def _segment_from(n: Node) -> Segment:
    a, b = _interval(n)
    return Segment(
        group=n.req_str("group"),
        start=a,
        end=b,
        step=n.req_int("step"),
        trace=n.str_or("trace", ""),
        share=_num_or(n, "share", 1.0),
    )


def _collective_from(n: Node) -> CollectiveEvent:
    a, b = _interval(n, "issue_start", "issue_end")
    start, end = _opt_num(n, "start"), _opt_num(n, "end")
    if start is not None and end is not None and end < start:
        n["end"].fail(f"{end} is before start ({start})")
    ws, we = _opt_num(n, "wait_start"), _opt_num(n, "wait_end")
    if ws is not None and we is not None and we < ws:
        n["wait_end"].fail(f"{we} is before wait_start ({ws})")
    shape = n.get("shape")
    return CollectiveEvent(
        step=n.req_int("step"),
        index=n.req_int("index", minimum=1),
        kind=n.req_str("kind"),
        tensor=n.req_str("tensor"),
        issue_start=a,
        issue_end=b,
        start=start,
        end=end,
        wait_start=ws,
        wait_end=we,
        sync=_bool_or(n, "sync", False),
        shape=None if shape is None else tuple(shape.int_list(minimum=0)),
        dtype=n.opt_str("dtype"),
        bytes=n.opt_int("bytes", minimum=0),
        group_size=n.opt_int("group_size", minimum=1),
        region=n.str_or("region", ""),
        trace=n.opt_str("trace"),
        group=n.opt_str("group"),
        ledger_position=n.opt_int("ledger_position"),
        op_index=n.opt_int("op_index"),
        wait_op_index=n.opt_int("wait_op_index"),
    )


def _ops_from(n: Node | None) -> OpTable:
    if n is None:
        return OpTable()
    names = [x.string() for x in n.req_list("names")]
    start = _numbers(n["start"])
    count = len(start)
    cols = {"name_ids": n["name_ids"], "dur": n["dur"], "lane": n["lane"]}
    for col in cols.values():
        if not isinstance(col.value, list):
            col.items()  # names the field and what it holds instead
        if len(col.value) != count:
            col.fail(f"{len(col.value)} entries, but start has {count}")
    ids = cols["name_ids"].int_list(minimum=0, maximum=max(len(names) - 1, 0))
    if ids and not names:
        cols["name_ids"].fail("indexes names, but names is empty")
    return OpTable(
        names=names,
        name_ids=ids,
        start=start,
        dur=_numbers(cols["dur"], minimum=0),
        lane=cols["lane"].int_list(minimum=0, maximum=1),
    )


def _clock_from(n: Node | None) -> ClockEstimate:
    if n is None:
        return ClockEstimate()
    unc = _opt_num(n, "uncertainty")  # null: unknown (JSON has no infinity)
    return ClockEstimate(
        offset=_num_or(n, "offset", 0.0),
        uncertainty=math.inf if unc is None else unc,
        rounds=n.opt_int("rounds", minimum=0) or 0,
        method=n.str_or("method", "none"),
    )


def _samples_from(n: Node) -> list[tuple[float, float]]:
    out = []
    for pair in n.opt_list("clock_samples"):
        items = pair.items()
        if len(items) != 2:
            pair.fail("must be a [before, after] pair")
        a, b = _number(items[0]), _number(items[1])
        if b < a:
            pair.fail(f"after ({b}) is before before ({a})")
        out.append((a, b))
    return out


def _rank_from(n: Node) -> RankTimeline:
    world = n.req_int("world_size", minimum=1)
    rank = n.req_int("rank")
    if not 0 <= rank < world:
        n["rank"].fail(f"must be in 0..world_size-1 (world_size {world}), got {rank}")
    return RankTimeline(
        rank=rank,
        world_size=world,
        steps=[_region_from(x) for x in n.req_list("steps")],
        regions=[_region_from(x) for x in n.opt_list("regions")],
        collectives=[_collective_from(x) for x in n.opt_list("collectives")],
        segments=[_segment_from(x) for x in n.opt_list("segments")],
        ops=_ops_from(n.get("ops")),
        clock_samples=_samples_from(n),
        clock=_clock_from(n.get("clock")),
        aligned=_bool_or(n, "aligned", False),
        host=n.str_or("host", ""),
        pid=n.opt_int("pid") or 0,
        device=n.str_or("device", "cpu"),
        backend=n.str_or("backend", ""),
        step_rule=n.str_or("step_rule", ""),
        warmup_included=_bool_or(n, "warmup_included", False),
        notes=[x.string() for x in n.opt_list("notes")],
        unprofiled_steps=_unprofiled_from(n),
    )


def _unprofiled_from(n: Node) -> dict[int, float]:
    """``[[step, microseconds], ...]``: whole step numbers >= 1, durations >= 0."""
    out: dict[int, float] = {}
    for pair in n.opt_list("unprofiled_steps"):
        items = pair.items()
        if len(items) != 2:
            pair.fail("must be a [step, microseconds] pair")
        step, us = items[0].integer(minimum=1), _number(items[1])
        if us < 0:
            pair.fail(f"a step cannot last {us} microseconds")
        out[step] = us
    return out


def load(*paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str = "") -> Timeline:
    """Read one or more files written by ``save`` (one per rank, or one aligned timeline) into one ``Timeline``.

    Raises:
        TraceFormatError: a file is missing, not JSON, not a thunderviz timeline, from another version, or has a
            malformed field (the message names the file and the field, e.g. ``ranks[0].collectives[3].start``).
    """
    flat: list[str | os.PathLike[str]] = []
    for p in paths:
        flat.extend(p if isinstance(p, (list, tuple)) else [p])
    if not flat:
        raise TypeError("load(*paths): pass at least one timeline file (one per rank, or one saved Timeline)")
    rank_lists: list[RankTimeline] = []
    problems: list[str] = []
    names: list[str] = []
    for p in flat:
        doc_name, doc_problems, doc_ranks = read_timeline_file(p)
        names.append(doc_name)
        problems.extend(doc_problems)
        rank_lists.extend(doc_ranks)
    label = name or next((n for n in names if n), "")
    seen: dict[int, str] = {}
    for p, r in zip(flat, rank_lists, strict=False):
        if r.rank in seen:
            raise TraceFormatError(
                f"load({str(p)!r}): rank {r.rank} is also in {seen[r.rank]!r}; pass one file per rank."
            )
        seen[r.rank] = str(p)
    return Timeline.from_ranks(rank_lists, name=label, problems=problems)

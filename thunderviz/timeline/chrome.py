"""A ``Timeline`` as one Trace Event Format document (the JSON Perfetto and chrome://tracing open).

One process per rank (``pid`` = rank, named ``rank N``), with threads as lanes:

- ``steps and regions``: each step, and its forward / backward / optimizer regions nested inside;
- ``main thread ops``: the top-level ops the rank's main thread ran;
- ``collectives (issue, wait)``: each collective's issue call and the ``wait()`` that blocked the rank;
- ``compute by module``: compute attributed to the module groups of the collapsed graph;
- ``communication``: the backend's work (gloo worker / NCCL kernel), one lane per concurrently running item;
- ``GPU kernels`` when CUDA activity was recorded.

Complete events (``ph: "X"``) on one thread must nest, so concurrent items go to separate lanes. Times stay in
microseconds on the common clock (the timeline's), so the ranks line up in the viewer as they did in reality.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the model calls in here; at run time this module only reads its attributes
    from thunderviz.timeline.events import RankTimeline, TimelineShape

__all__ = ["chrome_trace"]

_STEPS, _OPS, _COLL, _MODULES, _GPU, _COMM = 0, 1, 2, 3, 9, 10


def chrome_trace(timeline: TimelineShape) -> dict[str, Any]:
    """The Trace Event Format object for ``timeline`` (JSON Object Format, with ``traceEvents``)."""
    events: list[dict[str, Any]] = []
    for rank, t in sorted(timeline.ranks.items()):
        events.extend(_rank_events(rank, t))
    other = {
        "generator": "thunderviz",
        "name": timeline.name,
        "world_size": timeline.world_size,
        "clock": {str(r): t.clock.to_dict() for r, t in sorted(timeline.ranks.items())},
        "problems": list(timeline.problems),
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _meta(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    key = "name" if name.endswith("_name") else "sort_index"
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def _x(
    pid: int, tid: int, name: str, cat: str, start: float, end: float, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    # The ends are rounded, and the duration taken between them: rounding ``ts`` and ``dur`` each on its own put an
    # event that starts where its neighbour ends 1 ns inside it, which breaks the nesting viewers draw by.
    ts, te = round(start, 3), round(end, 3)
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": ts, "dur": round(max(te - ts, 0.0), 3)}
    if args:
        ev["args"] = args
    return ev


def _rank_events(rank: int, t: RankTimeline) -> list[dict[str, Any]]:
    pid = rank
    label = f"rank {rank}" + (f" ({t.host} pid {t.pid})" if t.host else "")
    out = [_meta(pid, 0, "process_name", label), _meta(pid, 0, "process_sort_index", rank)]
    lanes = {
        _STEPS: "steps and regions",
        _OPS: "main thread ops",
        _COLL: "collectives (issue, wait)",
        _MODULES: "compute by module",
    }
    if any(ln == 1 for ln in t.ops.lane):
        lanes[_GPU] = "GPU kernels"
    for s in t.steps:
        out.append(_x(pid, _STEPS, f"step {s.step}", "step", s.start, s.end))
    for r in t.regions:
        out.append(_x(pid, _STEPS, r.kind + (f" {r.name}" if r.name else ""), r.kind, r.start, r.end, {"step": r.step}))
    for name, start, dur, lane in t.ops.rows():
        out.append(_x(pid, _GPU if lane == 1 else _OPS, name, "gpu_op" if lane == 1 else "cpu_op", start, start + dur))
    for seg in t.segments:
        out.append(
            _x(
                pid,
                _MODULES,
                seg.group,
                "compute",
                seg.start,
                seg.end,
                {"trace": seg.trace, "share": seg.share, "step": seg.step},
            )
        )
    comm_lane_ends: list[float] = []
    for c in t.collectives:
        args = {
            "step": c.step,
            "index": c.index,
            "kind": c.kind,
            "tensor": c.tensor,
            "shape": None if c.shape is None else list(c.shape),
            "dtype": c.dtype,
            "bytes": c.bytes,
            "group_size": c.group_size,
            "sync": c.sync,
            "region": c.region,
            "group": c.group,
            "ledger_position": c.ledger_position,
            "blocked_us": round(c.blocked, 3),
        }
        out.append(_x(pid, _COLL, f"issue {c.label}", "collective_issue", c.issue_start, c.issue_end, args))
        if c.wait_start is not None and c.wait_end is not None:
            out.append(
                _x(
                    pid,
                    _COLL,
                    f"wait {c.label}",
                    "collective_wait",
                    c.wait_start,
                    c.wait_end,
                    {"step": c.step, "index": c.index},
                )
            )
        if c.start is not None and c.end is not None:
            lane = next((i for i, end in enumerate(comm_lane_ends) if end <= c.start), len(comm_lane_ends))
            if lane == len(comm_lane_ends):
                comm_lane_ends.append(c.end)
            else:
                comm_lane_ends[lane] = c.end
            out.append(_x(pid, _COMM + lane, c.label, "collective", c.start, c.end, args))
    for i in range(len(comm_lane_ends)):
        lanes[_COMM + i] = "communication" + (f" {i + 1}" if len(comm_lane_ends) > 1 else "")
    for tid, name in lanes.items():
        out.append(_meta(pid, tid, "thread_name", name))
        out.append(_meta(pid, tid, "thread_sort_index", tid))
    return out

"""Rank side: what the report needs from this rank after a cell, as plain picklable data (``ReportData``).

This cell's decisions, the traces and collectives ledgers of what ran (``cell_targets``), the process's memory and
the measured peak of the cell's steps (``rank.memory``).
A part that cannot be gathered is named in ``problems`` instead of failing the cell, which already ran. Importing
this module is cheap: psutil, torch and thunder load inside the functions.
"""

from __future__ import annotations

import socket
import time
import traceback
from typing import Any

from thunderviz.cell.protocol import PHASE_DATA_KEY, MemoryReading, ReportData
from thunderviz.cell.status import Phase
from thunderviz.rank import memory as memory_measure
from thunderviz.rank.cell_targets import CellSnapshot, cell_targets, strategy_of
from thunderviz.rank.state import STATE, publish, this_rank
from thunderviz.trace.workload import Workload, tensor_text

__all__ = ["collect", "read_memory"]


def read_memory(*, cuda: bool) -> MemoryReading:
    """This process's resident memory, and with ``cuda`` the CUDA caching allocator's peak and current bytes on the
    current device (the only place thunderviz measures memory; thunder's *estimated* peak per trace is in the
    trace model)."""
    import psutil

    memory = MemoryReading(rss_bytes=psutil.Process().memory_info().rss)
    if cuda:
        import torch

        memory["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        memory["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
    return memory


def _compiles() -> list[str]:
    """What this cell's compiles did (``thunder.reuse.compile_reuse``); empty when no strategy compiled anything."""
    import sys

    reuse = sys.modules.get("thunderviz.thunder.reuse.compile_reuse")
    return reuse.take_events() if reuse is not None else []


def collect(
    ns: dict[str, Any],
    before: CellSnapshot,
    *,
    keep_bundles: bool,
    by_object: dict[int, Any] | None = None,
    watch: Any = None,
) -> ReportData:
    """What the report needs from this rank for the cell that ran since ``before``.

    ``keep_bundles``: send the trace bundles themselves (else only their ledgers). ``by_object`` receives each
    captured bundle under the id of the object's compile data (the timeline names its collectives from them
    instead of capturing the traces again). ``watch``: the cell's ``CellPhaseWatch``; when the cell compiled, the
    compile line ends with where this rank's seconds went (``cell_phase.compile_split``).
    """
    rank = this_rank()
    step_memory, optimizers = memory_measure.cell_finished()
    result = ReportData(
        rank=rank,
        host=socket.gethostname(),
        memory=read_memory(cuda=STATE.setup is not None and STATE.setup.backend == "nccl"),
        step_memory=step_memory,
        # only this cell's decisions: the log of a Fabric reused across cells keeps growing
        decisions=list(getattr(strategy_of(ns), "decisions", None) or [])[before.decisions :],
        bundles={},
        ledgers={},
        problems=[],
        compile=_compiles(),
    )
    try:
        targets = cell_targets(ns, before)
    except Exception:
        result["problems"].append("could not list the traced objects:\n" + traceback.format_exc())
        return result
    if not targets:
        _add_split(result, watch, 0.0)
        return result
    publish({PHASE_DATA_KEY: Phase.COLLECTING})
    capturing = time.perf_counter()
    try:
        from thunderviz.thunder.capture.traces import capture
        from thunderviz.thunder.compile_state import compile_key
        from thunderviz.trace.ledger import ledger_from_bundle
    except ImportError as exc:
        result["problems"].append(f"the trace model is not available in this build ({exc}); traces were not captured")
        return result
    captured: dict[str, Any] = {}
    for name, obj in targets:
        try:
            bundle = captured[name] = capture(obj, name, rank=rank)
            result["ledgers"][name] = ledger_from_bundle(bundle)
            if by_object is not None:
                by_object[compile_key(obj)] = bundle
            if keep_bundles:
                result["bundles"][name] = bundle
        except Exception:
            result["problems"].append(f"capturing {name!r} failed:\n" + traceback.format_exc())
    result["workload"] = _workload(targets, captured, optimizers)
    _add_split(result, watch, time.perf_counter() - capturing)
    return result


def _workload(targets: list[tuple[str, Any]], bundles: dict[str, Any], optimizers: list[str]) -> Workload | None:
    """What the cell trained (``trace.workload``): its first traced module, that module's batch as its forward trace
    read it, the optimizers that stepped, the ranks; None when no module was traced."""
    from thunderviz.process_rank import process_rank
    from thunderviz.thunder.modules import model_size

    for name, obj in targets:
        size = model_size(obj)
        if size is None:
            continue
        bundle = bundles.get(name)
        inputs = bundle.forward.tensor_inputs() if bundle is not None else []
        batch = tuple(tensor_text(t.dtype or "?", t.shape or ()) for t in inputs)
        return Workload(size[0], size[1], batch, " + ".join(optimizers), process_rank().world_size)
    return None


def _add_split(result: ReportData, watch: Any, captured_s: float) -> None:
    """Where this rank's seconds went, after what its compiles did (only for a cell that compiled something)."""
    if watch is None or not result["compile"]:
        return
    from thunderviz.rank.cell_phase import compile_split

    reused = all(e.startswith("reused") for e in result["compile"])
    total = time.perf_counter() - watch.started_at
    split = compile_split(watch.spent, captured_s=captured_s, total_s=total, reused=reused)
    if split:
        result["compile"].append(split)

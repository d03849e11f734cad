"""Old import path of the trace model, its file format and capture; kept until every importer has moved.

The code lives in ``thunderviz.core.trace_model`` (dataclasses), ``thunderviz.core.trace_file`` (save/load) and
``thunderviz.core.capture`` (reading thunder's traces). Import from there. This shim imports capture's module,
which imports no thunder until ``capture`` is called.
"""

from __future__ import annotations

from thunderviz.core.capture import capture, snapshot_trace
from thunderviz.core.trace_file import FORMAT_NAME, FORMAT_VERSION, load, save
from thunderviz.core.trace_model import BOOKKEEPING_OPS, OpRecord, SourceRef, TensorRef, TraceBundle, TraceSnapshot

__all__ = [
    "BOOKKEEPING_OPS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "OpRecord",
    "SourceRef",
    "TensorRef",
    "TraceBundle",
    "TraceSnapshot",
    "capture",
    "load",
    "save",
    "snapshot_trace",
]

"""Another bucketing laid out on the traces thunder already built for a rehearsal, instead of tracing again.

thunder's tracing is most of what a rehearsal costs, and FSDP options that differ only in bucketing trace the same
program: ``record_comm_pass`` keeps what thunder hands the communication pass (the optimized forward and backward,
before bucketing), and ``relayout`` calls the pass again on them with the other bucketing's labels, exactly as thunder
calls it after optimization, and makes the cached entry run the result (``thunder.memory.rehearsal.rehearse_all``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from thunderviz.parallel.buckets import find_blocks
from thunderviz.parallel.option_values import Bucketing
from thunderviz.parallel.strategy_options import StrategyOptions

__all__ = ["RecordedTraces", "record_comm_pass", "relayout"]


@dataclass
class RecordedTraces:
    """What the communication pass received for the cache entry thunder built: the optimized forward and backward
    traces (before bucketing) and the parameters it was told about."""

    transform: Any
    traces: list[Any]


def record_comm_pass(jitted: Any) -> RecordedTraces:
    """Keep what thunder hands the communication pass, so another bucketing can be laid out on the same traces."""
    import thunder

    from thunderviz.thunder.comm.comm_pass import ensure_comm_transform

    transform = ensure_comm_transform(thunder.compile_data(jitted))
    recorded = RecordedTraces(transform, [])
    original = transform.transform_trace_post_optimization

    def keep(trace: Any, **kwargs: Any) -> Any:
        recorded.traces.append(trace)
        return original(trace, **kwargs)

    transform.transform_trace_post_optimization = keep
    return recorded


def relayout(jitted: Any, recorded: RecordedTraces, options: StrategyOptions, module: nn.Module) -> None:
    """Lay ``options``' bucketing out on the traces thunder built for ``jitted`` and make its cache entry run them.

    The communication pass is called exactly as thunder calls it after optimization (forward, then backward), with the
    same parameters relabelled for the new buckets (``thunder.comm.setup``'s labels); the results are compiled the way
    thunder compiles a cache entry's computation and backward.
    """
    import dataclasses

    import thunder
    from thunder.common import transform_to_torch_types

    from thunderviz.parallel.buckets import bucket_label
    from thunderviz.thunder.comm.comm_pass import CommTransform

    forward, backward = recorded.traces[-2:]
    blocks = find_blocks(module) if options.bucketing_strategy is Bucketing.BLOCK else []
    fresh = CommTransform()
    fresh.current = {
        name: dataclasses.replace(
            rec,
            config=dataclasses.replace(
                rec.config,
                label=bucket_label(rec.config.param_name, options.bucketing_strategy, blocks),
                bucketing=options.bucketing_strategy,
            ),
        )
        for name, rec in recorded.transform.current.items()
    }
    new_forward = fresh.transform_trace_post_optimization(forward)
    new_backward = fresh.transform_trace_post_optimization(backward)
    cs = thunder.compile_stats(jitted)
    entry = cs.interpreter_cache[-1]
    cs.interpreter_cache[-1] = entry._replace(
        computation_fn=transform_to_torch_types(new_forward).python_callable(),
        computation_traces=[*entry.computation_traces, new_forward],
        backward_fn=new_backward.python_callable(),
        backward_traces=[*entry.backward_traces, new_backward],
    )
    recorded.transform.buckets = fresh.buckets  # what compile_state.comm_buckets reads

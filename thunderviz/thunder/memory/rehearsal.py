"""Rehearse one training step of a strategy on the meta device and count every byte: the memory a plan predicts.

Why a rehearsal rather than a formula: the memory of a step is what thunder's traces allocate and free, and those
depend on the strategy in ways no formula keeps up with (what forward saves for backward, which unsharded weights a
bucket keeps alive, how long each communication buffer lives, what the optimizer allocates). So the rehearsal runs
the *real* thing — the model copied to the meta device (no memory, ``thunder.memory.meta_model``), sharded or
replicated exactly as the strategies do it (``thunder.comm.distribute``'s layout), its communication plan attached
(``thunder.comm.setup``), ``thunder.jit``, thunder's own traces rewritten by the real communication pass
(``thunder.comm.comm_pass``) — for the world size asked,
inside this one process (``thunder.memory.meta_world``: a process group object of that size that nothing reaches, and
collectives that finish at once on meta tensors). Torch's meta kernels give every tensor its shape; the
``StorageTracker`` counts storages the way torch's ``MemTracker`` does and labels each byte.

The step is what a training loop does and what the ranks measure (``thunder.memory.meter``):
``out = model(*inputs); loss = loss_fn(out); loss.backward(); optimizer.step(); optimizer.zero_grad()``. It runs
twice: the first compiles and creates the optimizer state; the second is counted, from the end of the first
``optimizer.step()`` to the end of its own (as the ranks' window: the first step's ``zero_grad`` is inside it), with
the parameters, gradients, optimizer state and inputs alive at its start registered first, as ``MemTracker``'s
``track_external`` does. The step's output and loss are released at its end.

Repeated blocks (``cut_blocks``): a transformer's memory at its peak is an affine function of its number of blocks
once the peak sits among blocks rather than at the model's edge, because every block adds the same tensors at the
same place. The plan rehearses the model cut to its first 2 and 3 blocks and extrapolates every category to the
whole model; 2 is the first count at which a block follows a block (with one block, ZERO3 + BLOCK gathers the root
bucket next to the only block, a configuration the whole model never has — measured on a 4-block GPT). The proof is
``tests/thunder/test_rehearsal.py``: the extrapolation equals a whole rehearsal byte for byte.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from thunderviz.parallel.checkpointing import select_checkpointed
from thunderviz.parallel.extrapolation import Timeline
from thunderviz.parallel.option_values import Parallelism
from thunderviz.parallel.strategy_options import StrategyOptions
from thunderviz.thunder import compile_state
from thunderviz.thunder.jit.checkpointed_forward import checkpoint_modules_
from thunderviz.thunder.jit.executors import decided_executors, uncompiled_fusions
from thunderviz.thunder.jit.hf import prepare_copy
from thunderviz.thunder.memory.meta_model import (
    block_container,
    distribute_on_meta,
    make_optimizer,
    meta_inputs,
    meta_twin,
)
from thunderviz.thunder.memory.meta_world import fake_group, meta_collectives, target_device
from thunderviz.thunder.memory.relayout import record_comm_pass, relayout
from thunderviz.thunder.memory.storage_tracker import StorageTracker
from thunderviz.thunder.reuse import compile_reuse
from thunderviz.trace.buckets import Bucket
from thunderviz.trace.memory import MemoryEstimate
from thunderviz.trace.model import TraceBundle
from thunderviz.trace.wire import ring_bytes

__all__ = [
    "PRECISIONS",
    "Rehearsal",
    "rehearsal_runs",
    "rehearse",
    "rehearse_all",
    "rehearse_worlds",
    "scalable_world_sizes",
]

#: ``Fabric(precision=...)`` values a rehearsal reproduces as Fabric's precision plugins do: the parameters in that
#: dtype, floating inputs cast to it, forward run with it as the default dtype, floating outputs cast back to float32.
PRECISIONS: dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
}


@dataclass
class Rehearsal:
    """What one rehearsed step gave: the peak (``memory``), the communication the traces do per step, the traces.

    ``comm_bytes`` is what this rank sends per step with ring algorithms (``trace.wire.ring_bytes``) over every
    bucket the communication pass laid out; ``collectives`` their number; ``blocks`` how many repeated blocks the
    rehearsed model had (``None`` when it has none); ``reduced_bytes`` and ``reductions`` the input bytes and
    number of the reduce_scatters (what a hybrid mesh all-reduces across hosts, ``parallel.plan``).
    """

    memory: MemoryEstimate
    comm_bytes: int
    collectives: int
    buckets: list[Bucket]
    bundle: TraceBundle | None
    blocks: int | None
    reduced_bytes: int = 0
    reductions: int = 0
    #: the step moment by moment, for extrapolating over blocks (``parallel.extrapolation``)
    timeline: Timeline | None = None


# -- one step, counted -----------------------------------------------------------------------------------------


def _saved_for_backward(root: Any) -> list[torch.Tensor]:
    """Every tensor autograd keeps for backward in the graph ending at ``root`` (thunder's function and eager ops)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            saved = getattr(node, "saved_tensors", ()) or ()
        except RuntimeError:  # already freed
            saved = ()
        out.extend(t for t in saved if isinstance(t, torch.Tensor))
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except RuntimeError:
                    continue
                values = value if isinstance(value, (list, tuple)) else (value,)
                out.extend(v for v in values if isinstance(v, torch.Tensor))
        stack.extend(f for f, _ in getattr(node, "next_functions", ()) if f is not None)
    return out


def _default_loss(out: Any) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"plan: the model returned a {type(out).__name__}, so the default loss (output.sum()) does not apply;"
            " pass loss_fn=... taking the model's output and returning a scalar"
        )
    return out.sum()


def _float32_outputs(out: Any) -> Any:
    """Fabric's ``convert_output`` for the ``-true`` half precisions: floating outputs back in float32."""
    if isinstance(out, torch.Tensor):
        return out.to(torch.float32) if out.is_floating_point() else out
    if isinstance(out, (list, tuple)):
        return type(out)(_float32_outputs(o) for o in out)
    if isinstance(out, dict):
        return {k: _float32_outputs(v) for k, v in out.items()}
    return out


def _step(
    jitted: Any,
    inputs: tuple,
    loss_fn: Callable[[Any], torch.Tensor],
    opt: torch.optim.Optimizer,
    tracker: StorageTracker | None,
    dtype: torch.dtype,
) -> None:
    if tracker is not None:
        tracker.phase = "forward"
    with _default_dtype(dtype):
        out = jitted(*inputs)
    if dtype is not torch.float32:
        out = _float32_outputs(out)
    loss = loss_fn(out)
    if tracker is not None:
        tracker.label_all(_saved_for_backward(loss.grad_fn), "saved activations")
        tracker.phase = "backward"
    loss.backward()
    if tracker is not None:
        tracker.phase = "optimizer step"
    opt.step()
    del out, loss


def _register_state(tracker: StorageTracker, module: nn.Module, opt: torch.optim.Optimizer, inputs: tuple) -> None:
    """What is alive when the counted step starts, as ``MemTracker.track_external(module, optimizer, inputs)``
    (under FSDP the parameters, their gradients and optimizer state are shards)."""
    shards = tracker.sharding
    for p in module.parameters():
        tracker.label(p, "parameters", "parameters", force=True, sharded=shards)
        if p.grad is not None:
            tracker.label(p.grad, "gradients", "gradients", force=True, sharded=shards)
    for b in module.buffers():
        tracker.label(b, "parameters", "parameters", force=True, sharded=False)
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                tracker.label(v, "optimizer state", "optimizer", force=True, sharded=shards and v.numel() > 1)
    tracker.label_all([a for a in inputs if isinstance(a, torch.Tensor)], "inputs")


def scalable_world_sizes(module: nn.Module, world_sizes: Sequence[int]) -> bool:
    """Whether one FSDP rehearsal can count all ``world_sizes`` (``StorageTracker``'s module doc): no parameter needs
    padding at any of them (every first dimension divisible, no 0-dim parameter)."""
    return all(
        p.dim() >= 1 and p.shape[0] % w == 0
        for _, p in module.named_parameters(remove_duplicate=True)
        for w in world_sizes
    )


def rehearse(
    template: nn.Module,
    example_input: Any,
    *,
    options: StrategyOptions,
    world_size: int,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: Any = "adamw",
    precision: str = "32-true",
    device: str = "cpu",
    capture_traces: bool = True,
) -> Rehearsal:
    """``rehearse_worlds`` for one world size."""
    return rehearse_worlds(
        template,
        example_input,
        options=options,
        world_sizes=(world_size,),
        loss_fn=loss_fn,
        optimizer=optimizer,
        precision=precision,
        device=device,
        capture_traces=capture_traces,
    )[world_size]


def rehearse_worlds(
    template: nn.Module,
    example_input: Any,
    *,
    options: StrategyOptions,
    world_sizes: Sequence[int],
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: Any = "adamw",
    precision: str = "32-true",
    device: str = "cpu",
    capture_traces: bool = True,
) -> dict[int, Rehearsal]:
    """The rehearsal at each of ``world_sizes`` (see ``rehearse_all``)."""
    return rehearse_all(
        template,
        example_input,
        options=[options],
        world_sizes=world_sizes,
        loss_fn=loss_fn,
        optimizer=optimizer,
        precision=precision,
        device=device,
        capture_traces=capture_traces,
    )[0]


def rehearse_all(
    template: nn.Module,
    example_input: Any,
    *,
    options: Sequence[StrategyOptions],
    world_sizes: Sequence[int],
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: Any = "adamw",
    precision: str = "32-true",
    device: str = "cpu",
    capture_traces: bool = True,
    progress: Callable[[Sequence[StrategyOptions], int], None] | None = None,
) -> list[dict[int, Rehearsal]]:
    """Each of ``options`` rehearsed at each of ``world_sizes``, tracing as little as is exact; ``progress(layouts,
    world_size)`` is called after each traced run (``rehearsal_runs`` lists them).

    thunder's tracing is what a rehearsal costs, so it is shared where the traces are the same up to what is counted:
    one step counts every world size when that is exact (DDP's memory does not depend on it; FSDP's only through its
    shards, see ``StorageTracker``), and FSDP options that differ only in bucketing share one trace, the
    communication pass laying out each bucketing on the same optimized traces (``relayout``), as it does when thunder
    calls it. Across calls, thunder's interpreter (most of a trace) is shared by compile reuse: ZERO2 and ZERO3 of one
    model interpret to the same trace, as does a rehearsal repeated (a plan made again, the auto strategy predicting
    what a plan on its rank predicted); see ``_rehearse``. Returns one ``{world size: Rehearsal}`` per entry of
    ``options``.
    """
    sizes = sorted(set(world_sizes))
    kwargs = {"loss_fn": loss_fn, "optimizer": optimizer, "precision": precision, "device": device}
    results: dict[int, dict[int, Rehearsal]] = {}
    for members, reference, others in rehearsal_runs(template, options, sizes):
        layouts = [options[i] for i in members]
        got = _rehearse(
            template,
            example_input,
            layouts=layouts,
            reference=reference,
            others=others,
            capture_traces=capture_traces,
            **kwargs,
        )
        for i, per_world in zip(members, got, strict=True):
            results.setdefault(i, {}).update(per_world)
        if progress is not None:
            progress(layouts, reference)
    return [results[i] for i in range(len(options))]


def rehearsal_runs(
    template: nn.Module, options: Sequence[StrategyOptions], sizes: Sequence[int]
) -> list[tuple[list[int], int, tuple[int, ...]]]:
    """The traced runs ``rehearse_all`` makes: (indices of the options sharing one trace, the world size it runs at,
    the other world sizes it counts), in order; a progress bar counts them."""
    groups: dict[tuple, list[int]] = {}
    for i, o in enumerate(options):
        key = (
            o.parallelism,
            o.sharding_strategy if o.parallelism is Parallelism.FSDP else None,
            o.executors,
            o.jit_kwargs,
            o.activation_checkpointing_policy,
        )
        groups.setdefault(key, []).append(i)
    runs = []
    for members in groups.values():
        first = options[members[0]]
        one_step = len(sizes) == 1 or first.parallelism is Parallelism.DDP or scalable_world_sizes(template, sizes)
        for reference, others in [(sizes[0], tuple(sizes[1:]))] if one_step else [(w, ()) for w in sizes]:
            runs.append((members, reference, others))
    return runs


def _rehearse(
    template: nn.Module,
    example_input: Any,
    *,
    layouts: Sequence[StrategyOptions],
    reference: int,
    others: Sequence[int],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: Any,
    precision: str,
    device: str,
    capture_traces: bool,
) -> list[dict[int, Rehearsal]]:
    """Counted training steps of ``template`` as rank 0 of ``reference`` ranks (module doc): traced once with
    ``layouts[0]``, one counted step per layout (the later ones run the first's traces laid out again, ``relayout``).

    Args:
        template: the model; it is copied to the meta device first and never touched.
        example_input: what one rank's ``model(...)`` takes: a tensor or a tuple of arguments (meta is fine).
        layouts: the strategy's options (``parallel.strategy_options.StrategyOptions``), differing at most in bucketing.
        reference: ranks the step runs with; ``others``: further world sizes counted from it (``StorageTracker``).
        loss_fn: output -> scalar; default ``output.sum()``.
        optimizer: see ``make_optimizer``.
        precision: one of ``PRECISIONS``.
        device: ``"cpu"`` or ``"cuda"``: the ranks' device (executor choices, allocator rounding, optimizer form).
        capture_traces: also capture the traces (``thunder.capture.traces``) for the memory view.
    """
    options = layouts[0]
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision={precision!r}: a plan reproduces {', '.join(PRECISIONS)}; mixed precision (autocast) is not"
            " planned yet"
        )
    dtype = PRECISIONS[precision]
    module = meta_twin(template)
    if dtype is not torch.float32:
        module = module.to(dtype)
    found = block_container(module)
    prepare_copy(module)  # a transformers model: its masks and cache, as the strategy's decision prepares them
    if options.activation_checkpointing_policy is not None:  # as the strategy does, before anything traces it
        checkpoint_modules_(module, select_checkpointed(module, options.activation_checkpointing_policy))
    inputs = meta_inputs(example_input, dtype if dtype is not torch.float32 else None)
    group = fake_group(reference)
    grad_hooks: list[Any] = []
    results: list[dict[int, Rehearsal]] = []
    tracker = _tracker(reference, others, options, device)
    with target_device(device), meta_collectives(lambda: tracker), uncompiled_fusions(lambda: tracker):
        # the executors the strategy's own thunder.jit will get (the decision table's rule): fusion executors change
        # what forward saves for backward (5x on a GPT measured on an H200)
        executors = decided_executors(options, device)[0]
        # kept by compile reuse, apart from the set-ups (QUIET): a later rehearsal of the same program skips thunder's
        # interpreter, which counts the same bytes (tests/thunder/test_rehearsal.py); the group is one per world size
        compile_reuse.mark(module, quiet=True)
        jitted = compile_state.jit(module, executors=executors, **dict(options.jit_kwargs))
        distribute_on_meta(module, jitted, options, group)
        recorded = record_comm_pass(jitted)
        opt = make_optimizer(optimizer, [p for p in module.parameters() if p.requires_grad], device)
        loss = loss_fn or _default_loss
        _step(jitted, inputs, loss, opt, None, dtype)  # compiles; creates the optimizer state
        for p in module.parameters():
            if p.requires_grad:
                grad_hooks.append(
                    p.register_post_accumulate_grad_hook(
                        lambda q: tracker.label(q.grad, "gradients", "gradients", force=True)
                    )
                )
        for k, layout in enumerate(layouts):
            if k:
                relayout(jitted, recorded, layout, module)
                tracker = _tracker(reference, others, layout, device)
            with tracker:
                _register_state(tracker, module, opt, inputs)
                if found is not None:
                    blocks = [list(b.parameters()) for b in module.get_submodule(found[0]).children()]
                    inside = {id(p) for ps in blocks for p in ps}
                    tracker.mark_blocks(blocks, [p for p in module.parameters() if id(p) not in inside])
                tracker.reset_peak()
                opt.zero_grad()
                _step(jitted, inputs, loss, opt, tracker, dtype)
            results.append(_results(jitted, tracker, template, reference, found, capture_traces))
    for h in grad_hooks:
        h.remove()
    del jitted, opt, module
    gc.collect()
    return results


def _tracker(reference: int, others: Sequence[int], options: StrategyOptions, device: str) -> StorageTracker:
    return StorageTracker(
        cuda_rounding=device == "cuda",
        count_devices={"meta", device},
        reference=reference,
        world_sizes=others,
        sharding=options.parallelism is Parallelism.FSDP,
    )


def _results(
    jitted: Any, tracker: StorageTracker, template: nn.Module, reference: int, found: Any, capture_traces: bool
) -> dict[int, Rehearsal]:
    bundle = None
    if capture_traces:
        from thunderviz.thunder.capture.traces import capture

        bundle = capture(jitted, type(template).__name__, rank=0, stages=False)
        bundle.world_size = reference
    buckets = _buckets(jitted)
    result = {}
    for w, peak in tracker.peaks.items():
        # What an all_gather sends is a shard; what a reduction takes is whole (see StorageTracker).
        sent = [b.bytes * reference // w if b.kind == "all_gather" else b.bytes for b in buckets]
        result[w] = Rehearsal(
            memory=peak,
            comm_bytes=sum(ring_bytes(b.kind, n, w) for b, n in zip(buckets, sent, strict=True)),
            collectives=len(buckets),
            buckets=buckets,
            bundle=bundle,
            blocks=found[1] if found else None,
            reduced_bytes=sum(b.bytes for b in buckets if b.kind == "reduce_scatter"),
            reductions=sum(1 for b in buckets if b.kind == "reduce_scatter"),
            timeline=tracker.timeline(w),
        )
    return result


def _buckets(jitted: Any) -> list[Bucket]:
    laid_out = compile_state.comm_buckets(jitted)
    return [Bucket.from_dict(b.to_dict()) for trace in ("forward", "backward") for b in laid_out.get(trace, [])]


class _default_dtype:
    """``torch.set_default_dtype`` for the step, as Fabric's ``-true`` precisions set it around forward."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self.old)

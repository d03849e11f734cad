"""Attribute each op of a trace to the module it belongs to, so a 1,451-op trace can be shown as a dozen blocks.

Thunder's execution traces do not say which ``nn.Module`` an op came from: forward ops carry a source line
inside torch (``linear.py:134`` for every Linear), backward ops carry nothing. What the traces do carry is data
flow and the names of the module's tensors (``t_blocks_0_attn_qkv_weight``). So:

1. an op that reads a parameter (or a value derived only from parameters: its all_gather, wait, transpose)
   belongs to that parameter's module;
2. any other op belongs to the module of its inputs, choosing the one that most recently read its own
   parameters (the residual ``x + attn(x)`` of block 1 reads block 0's output and block 1's, and belongs to
   block 1, both in forward order and in backward's reversed order);
3. in the backward trace, the ops that exist only to produce a parameter's gradient (matmul, sum,
   reduce_scatter, wait) belong to that parameter's module: the gradient's position in the backward's return
   matches the parameter's position in the forward's arguments;
4. an op whose only users sit in another block moves there, unless it reads its own module's parameter-reading
   ops (a layer norm's statistics belong to the norm's block; the residual add closing a block stays);
5. ops still unattributed (unpacks, constants) take their first consumer's module, then their predecessor's;
6. last, the communication of each bucket of two or more parameters (its pack, collective, wait and unpack) is
   named after the bucket (``all_gather blocks.0``), not a model module: it serves every module whose parameters
   it carries, and giving it to one (the root bucket's to ``lm_head``) drew the graph against the data flow.

Functions traced without a module have no parameter names; their ops are grouped by source line instead
(``@file.py:12``).

A fusion region (``OpRecord.fused``: torch.compile's, nvFuser's) runs many ops as one call, often across a module's
edge (a ZERO2 forward's last region runs ``blocks.3``'s MLP, ``ln_f`` and ``lm_head``). Given as one op it took the
module of its last input, and the modules it swallowed vanished from the graph. When the region's own ops were
captured (``OpRecord.inner``) the rules above run on the trace with every region opened, so each of its ops gets
its module; the region then belongs to that module when they share one, else it is named for the modules it spans in
the order it runs them (``blocks.3 -> lm_head``: ``region_modules`` lists them all).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

from thunderviz.trace.buckets import Bucket, is_bucket_group
from thunderviz.trace.model import OpRecord, TraceSnapshot

__all__ = [
    "SPAN",
    "assign_communication",
    "assign_modules",
    "bucket_ops",
    "module_of_param",
    "region_modules",
    "top_group",
]

_TENSOR_KINDS = ("tensor", "future")
_ROOT = "(root)"
#: Between the first and the last module a fusion region spans, in its name (``blocks.3 -> lm_head``).
SPAN = " -> "


def module_of_param(qualified_name: str) -> str:
    """``blocks.0.attn_qkv.weight`` -> ``blocks.0.attn_qkv``; a root-level parameter -> ``(root)``."""
    head, _, _ = qualified_name.rpartition(".")
    return head or _ROOT


def top_group(module: str | None) -> str:
    """The collapsed-view group of a module path: up to the first numeric component (``blocks.0``), else the
    first two components; source-line groups (``@file.py:12``) are kept whole."""
    if not module:
        return "(other)"
    if module.startswith(("@", "(")) or is_bucket_group(module) or SPAN in module:
        return module
    parts = module.split(".")
    for i, p in enumerate(parts):
        if p.isdigit() and i > 0:
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def assign_modules(forward: TraceSnapshot, backward: TraceSnapshot | None = None) -> None:
    """Set ``op.module`` on every op of ``forward`` (and ``backward``, using what forward taught us), and on the ops
    inside each fusion region whose ops were captured (see the module docstring)."""
    snaps = [s for s in (forward, backward) if s is not None]
    if not any(op.inner for s in snaps for op in s.ops):
        _assign_modules(forward, backward)
        for snap in snaps:
            assign_communication(snap)
        return
    opened = [_opened(s) for s in snaps]
    _assign_modules(opened[0][0], opened[1][0] if len(opened) > 1 else None)
    for snap, (flat, records) in zip(snaps, opened, strict=True):
        assign_communication(flat)
        for op, at in zip(snap.ops, records, strict=True):
            if op.inner:
                for inner, i in zip(op.inner, at, strict=True):
                    inner.module = flat.ops[i].module
                op.module = _region_module(op)
            else:
                op.module = flat.ops[at[0]].module


def region_modules(op: OpRecord) -> list[str]:
    """The collapsed groups (``top_group``) a fusion region's ops belong to, in the order it runs them; [] when its
    ops were not captured."""
    seen = dict.fromkeys(top_group(i.module) for i in op.inner if i.module and not i.is_bookkeeping)
    return list(seen)


def _region_module(op: OpRecord) -> str | None:
    """The region's own module: its ops' one module (the commonest path within it), else the span's name."""
    groups = region_modules(op)
    if len(groups) > 1:
        return f"{groups[0]}{SPAN}{groups[-1]}"
    paths = Counter(i.module for i in op.inner if i.module and not i.is_bookkeeping)
    return paths.most_common(1)[0][0] if paths else None


def _opened(snap: TraceSnapshot) -> tuple[TraceSnapshot, list[list[int]]]:
    """``snap`` with every captured fusion region replaced by its ops (copies; edges by tensor name, each read from
    its latest definition, as a rematerialized copy inside a later region is what that region reads), and for each
    op of ``snap`` the positions of what stands for it in the copy."""
    ops: list[OpRecord] = []
    records: list[list[int]] = []
    for op in snap.ops:
        parts, start = op.inner or (op,), len(ops)
        records.append(list(range(start, start + len(parts))))
        ops.extend([dataclasses.replace(p, index=start + k, inner=()) for k, p in enumerate(parts)])
    producer: dict[str, int] = {}
    edges: list[tuple[int, int, str]] = []
    for op in ops:
        for t in op.inputs:
            src = producer.get(t.name)
            if src is not None and src != op.index:
                edges.append((src, op.index, t.name))
        for t in op.outputs:
            producer[t.name] = op.index
    moved = {i: at[0] for i, at in enumerate(records)}
    buckets = [
        dataclasses.replace(b, issue_index=moved.get(b.issue_index, -1), wait_index=moved.get(b.wait_index, -1))
        for b in snap.buckets
    ]
    flat = dataclasses.replace(snap, ops=ops, edges=edges, buckets=buckets, accumulated=[])
    return flat, records


def assign_communication(snap: TraceSnapshot) -> None:
    """Name every op of a bucket's communication after the bucket (rule 6 of the module docstring)."""
    for bucket in snap.buckets:
        if len(bucket.params) > 1:
            for i in bucket_ops(snap, bucket):
                snap.ops[i].module = bucket.group


def bucket_ops(snap: TraceSnapshot, bucket: Bucket) -> list[int]:
    """The indices of one bucket's communication: the collective and its wait, the ops that only pack what it sends
    (walking back from the collective, stopping at whoever computed the sent values) and the ops that unpack what
    the wait returned (walking on from the wait through ops that read nothing else), bookkeeping included."""
    issue, wait = bucket.issue_index, bucket.wait_index
    members = {i for i in (issue, wait) if 0 <= i < len(snap.ops)}
    if not members:
        return []
    sends, results = set(bucket.sends), set(bucket.results)
    producer = snap.producers()
    consumers = snap.consumers()
    stack = [issue] if issue in members else []
    while stack:  # packing: producers whose outputs only this bucket reads
        for t in snap.ops[stack.pop()].inputs:
            j = producer.get(t.name)
            if j is None or j in members or any(o.name in sends for o in snap.ops[j].outputs):
                continue
            users = [c for c in consumers.get(j, []) if not snap.ops[c].is_bookkeeping]
            if users and all(u in members for u in users):
                members.add(j)
                stack.append(j)
    stack = [wait] if wait in members else []
    while stack:  # unpacking: consumers that read only what this bucket produced, up to the unpacked results
        for c in consumers.get(stack.pop(), []):
            op = snap.ops[c]
            if c in members or op.is_bookkeeping:
                continue
            ins = [t for t in op.inputs if t.kind in _TENSOR_KINDS]
            if all(producer.get(t.name) in members and t.name not in results for t in ins):
                members.add(c)
                stack.append(c)
    for op in snap.ops:  # the deletes of what only the bucket used
        if op.is_bookkeeping and op.inputs and all(producer.get(t.name) in members for t in op.inputs):
            members.add(op.index)
    return sorted(members)


def _assign_modules(forward: TraceSnapshot, backward: TraceSnapshot | None) -> None:
    origin = {name: module_of_param(q) for name, q in forward.param_names.items()}
    if origin:
        origin.update(_bucket_origins(forward))
    if not origin:
        _assign_by_source(forward)
        if backward is not None:
            for op in backward.ops:
                op.module = None
            _carry_from(forward, backward)
        return
    act: dict[str, str] = {}
    _assign_by_dataflow(forward, origin, act, returns={})
    if backward is None:
        return
    returns: dict[str, str] = {}
    if len(backward.return_names) == len(forward.arg_names):
        for grad_name, arg_name in zip(backward.return_names, forward.arg_names, strict=True):
            if grad_name and arg_name in forward.param_names:
                returns[grad_name] = module_of_param(forward.param_names[arg_name])
    returns = _unbucketed_returns(backward, returns)
    # Names are shared between forward and backward (saved tensors keep theirs), so what forward learned about
    # parameter-derived values and activations carries over.
    _assign_by_dataflow(backward, {**origin, **_bucket_origins(backward)}, dict(act), returns, carried=set(act))


def _unbucketed_returns(backward: TraceSnapshot, returns: dict[str, str]) -> dict[str, str]:
    """Gradient chains start at what each bucket sends, not at what it returns.

    Why: a bucketed reduction's returned gradients are views of one reduced buffer whose producer reads every
    gradient of the bucket, so walking up from the first returned gradient claimed the whole backward for that one
    parameter's module. The gradient a parameter contributes to the bucket (``sends``) is its own.
    """
    out = dict(returns)
    for b in backward.buckets:
        if b.kind in ("reduce_scatter", "all_reduce") and len(b.sends) == len(b.params):
            for result in b.results:
                out.pop(result, None)
            for send, param in zip(b.sends, b.params, strict=True):
                out[send] = module_of_param(param)
    return out


def _bucket_origins(snap: TraceSnapshot) -> dict[str, str]:
    """Each unsharded parameter a bucketed all_gather unpacks, named by its own module.

    Why: a bucket packs many parameters' shards into one buffer, so by data flow alone every op downstream of the
    unpack would read "the last parameter packed" (a whole GPT landed on ``wte`` and ``lm_head``). The bucket knows
    which unpacked tensor is which parameter; that is the same fact ``param_names`` gives for an unbucketed gather.
    """
    out: dict[str, str] = {}
    for b in snap.buckets:
        if b.kind == "all_gather" and len(b.results) == len(b.params):
            for result, param in zip(b.results, b.params, strict=True):
                out[result] = module_of_param(param)
    return out


def _assign_by_dataflow(
    snap: TraceSnapshot,
    origin: dict[str, str],
    active: dict[str, str],
    returns: dict[str, str],
    carried: frozenset[str] | set[str] = frozenset(),
) -> None:
    """``carried`` names were computed in forward and saved: a backward op that reads only those (a layer norm's
    saved mean) says nothing about where it sits in backward, so it takes its consumer's module instead."""
    last_touch: dict[str, int] = {}
    strong: set[int] = set()
    for op in snap.ops:
        ins = [t.name for t in op.inputs if t.kind in _TENSOR_KINDS]
        from_params = [origin[n] for n in ins if n in origin]
        shared: set[str] = set()
        if from_params and all(m == _ROOT for m in from_params) and any(n in active for n in ins if n not in origin):
            # A root-level buffer every block reads (litgpt's RoPE cos/sin) does not make the op the root's: the
            # activation it is applied to says which block computes it.
            from_params, shared = [], {n for n in ins if n in origin}
        if from_params:
            mod = from_params[-1]
            strong.add(op.index)
            if len(from_params) == len(ins) and len(set(from_params)) == 1:
                for t in op.outputs:
                    origin[t.name] = mod
            if not op.is_bookkeeping:
                last_touch[mod] = op.index
        else:
            cands = [active[n] for n in ins if n in active and n not in carried and n not in shared]
            mod = max(cands, key=lambda m: last_touch.get(m, -1)) if cands else None
        op.module = mod
        if mod is not None:
            for t in op.outputs:
                active.setdefault(t.name, mod)
    _pull_into_consumers(snap, strong)
    if returns:
        _claim_gradient_chains(snap, returns)
    _fill_gaps(snap)


def _pull_into_consumers(snap: TraceSnapshot, strong: set[int]) -> None:
    """Move an op whose only users sit in another block into that block, unless it reads a parameter-reading
    op of its own module (a root-level buffer's views move wherever they are used alone).

    A layer norm computes its statistics (var_mean, sub, rsqrt) from the residual stream before it reads its
    weight: by inputs alone those ops belong to the previous block, by purpose to the next. The residual add
    that closes a block reads that block's projection directly, so it stays.
    """
    producer = snap.producers()
    consumers = snap.consumers()
    for op in reversed(snap.ops):
        if (op.index in strong and op.module != _ROOT) or op.module is None or op.is_bookkeeping:
            continue
        users = {snap.ops[c].module for c in consumers.get(op.index, []) if not snap.ops[c].is_bookkeeping}
        if len(users) != 1:
            continue
        (target,) = users
        if target is None or top_group(target) == top_group(op.module):
            continue
        # Views of a root-level buffer (litgpt's RoPE cos/sin, reshaped again in every block) belong to the one
        # block that uses them, however they were anchored.
        anchored = op.module != _ROOT and any(
            (j := producer.get(t.name)) is not None and j in strong and snap.ops[j].module == op.module
            for t in op.inputs
        )
        if not anchored:
            op.module = target


def _claim_gradient_chains(snap: TraceSnapshot, returns: dict[str, str]) -> None:
    """Walk up from each returned gradient through ops whose outputs feed only that gradient."""
    producer = snap.producers()
    consumers = snap.consumers()
    by_index = snap.ops
    for grad_name, mod in returns.items():
        start = producer.get(grad_name)
        if start is None:
            continue
        chain = {start}
        stack = [start]
        while stack:
            i = stack.pop()
            by_index[i].module = mod
            for t in by_index[i].inputs:
                j = producer.get(t.name)
                if j is None or j in chain:
                    continue
                users = [c for c in consumers.get(j, []) if not by_index[c].is_bookkeeping]
                if users and all(u in chain for u in users):
                    chain.add(j)
                    stack.append(j)


def _fill_gaps(snap: TraceSnapshot) -> None:
    consumers = snap.consumers()
    for op in reversed(snap.ops):
        if op.module is None:
            for c in consumers.get(op.index, []):
                if snap.ops[c].module is not None and not snap.ops[c].is_bookkeeping:
                    op.module = snap.ops[c].module
                    break
    prev = None
    for op in snap.ops:
        if op.module is None:
            op.module = prev
        prev = op.module
    for op in snap.ops:
        if op.module is None:
            op.module = "(inputs)"


def _assign_by_source(snap: TraceSnapshot) -> None:
    for op in snap.ops:
        op.module = f"@{os.path.basename(op.source.file)}:{op.source.line}" if op.source is not None else None
    _fill_gaps(snap)


def _carry_from(forward: TraceSnapshot, backward: TraceSnapshot) -> None:
    """Backward ops of a module-less function: name them after the forward line whose saved values they read."""
    by_name = {t.name: op.module for op in forward.ops for t in op.outputs if op.module}
    for op in backward.ops:
        mods = [by_name[t.name] for t in op.inputs if t.name in by_name]
        if mods:
            op.module = mods[-1]
    _fill_gaps(backward)

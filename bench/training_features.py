"""Activation checkpointing and gradient accumulation: ours against torch FSDP2, side by side in one run.

Run: .venv/bin/python bench/training_features.py [--rounds N] [--warmup N] [--layers N]

A litgpt ``GPT(Config(...))`` (6 layers, d=128, LLaMA MLP, RMSNorm; random init), micro-batch 4x128 per rank, 2 CPU
ranks on gloo, one thread per rank. Every variant lives in the same two processes.

(a) Memory, one training step each, measured with torch's ``MemTracker`` (dispatch-level accounting of every
    tensor allocated, the CPU counterpart of ``torch.cuda`` memory stats): what is held between forward and
    backward (allocated after forward minus before: parameters gathered for backward and saved activations) and the
    peak of the step; for ours also what the forward trace saves for backward. Ours: ``ThunderFSDPStrategy`` ZERO2
    and ZERO3 (BLOCK buckets) with and without ``activation_checkpointing_policy={Block}``; torch's: FSDP2
    (``fully_shard`` per block, then the root) with ``reshard_after_forward`` False / True, with and without each
    block wrapped in ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``). Target: our reduction of
    what is held for backward >= torch's.
(b) Accumulation, 4 micro-batches per optimizer step: ours ZERO2 with ``fabric.no_backward_sync`` on the first 3
    against ours syncing every micro-batch, and FSDP2 (reshard False) with ``set_requires_gradient_sync(False)``
    against FSDP2 syncing every micro-batch; one-process baselines (``thunder.jit``, eager) in the same processes.
    Collectives per optimizer step are counted where the rank calls ``torch.distributed`` (both implementations
    call ``all_gather_into_tensor`` / ``reduce_scatter_tensor``) and checked against torch.profiler's ``c10d::``
    ops of the same step; steps are interleaved round by round. Distributed overhead = a variant's step minus its
    one-process baseline's step in the same round (median and quartiles over rounds): the pairing cancels most of a
    shared machine's load. Target: reduce_scatters per step = buckets x 1, and our distributed overhead with
    accumulation <= FSDP2's.

Memory is printed for both ranks, times as wall (rank 0; barrier-bounded) and CPU (averaged over the ranks).
"""

from __future__ import annotations

import os
import statistics
import sys
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

MICRO = 4
BATCH = 4
BLOCK_SIZE = 128
VOCAB = 512


def _config(layers: int) -> Any:
    from litgpt import Config

    return Config(
        block_size=BLOCK_SIZE,
        vocab_size=VOCAB,
        padded_vocab_size=VOCAB,
        n_layer=layers,
        n_head=4,
        n_query_groups=4,
        n_embd=128,
        intermediate_size=512,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
    )


def fresh_gpt(layers: int) -> Any:
    from litgpt import GPT

    torch.manual_seed(0)
    return GPT(_config(layers))


def batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, VOCAB, (BATCH, BLOCK_SIZE + 1), generator=torch.Generator().manual_seed(1000 * i + rank))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- counting collectives where the rank calls them -------------------------------------------------------------

_COUNTED = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_gather", "reduce_scatter")


@contextmanager
def counting_collectives() -> Any:
    """Count calls of torch.distributed's collectives (looked up by attribute at call time by both libraries)."""
    import torch.distributed as dist

    counts: dict[str, int] = {}
    originals = {name: getattr(dist, name) for name in _COUNTED}

    def wrap(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


# -- memory ---------------------------------------------------------------------------------------------------------


def _total(snapshot: dict[Any, dict[str, int]]) -> int:
    return sum(v.get("Total", 0) for v in snapshot.values())


def measure_memory(model: Any, opt: Any, forward: Any, backward: Any, rank: int) -> dict[str, int]:
    """One step under MemTracker: bytes held from the end of forward to backward, and the step's peak.

    A first step runs outside it: thunder traces on its first call, and its interpreter does not get along with the
    tracker's module hooks (only execution is measured, as on a GPU one would skip the compiling step).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    x, y = batch(rank, 0)
    backward(loss_of(forward(x), y))
    opt.zero_grad(set_to_none=True)
    mt = MemTracker()
    mt.track_external(model, opt, x, y)
    with mt:
        before = _total(mt.get_tracker_snapshot("current"))
        loss = loss_of(forward(x), y)
        held = _total(mt.get_tracker_snapshot("current")) - before
        backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"held_for_backward": held, "peak": _total(mt.get_tracker_snapshot("peak"))}


# -- the variants --------------------------------------------------------------------------------------------------


def _ours(world: int, layers: int, sharding: str, checkpointed: bool) -> tuple[Any, Any, Any]:
    from lightning.fabric import Fabric
    from litgpt.model import Block

    from thunderviz import ThunderFSDPStrategy

    options: dict[str, Any] = {"sharding_strategy": sharding}
    if checkpointed:
        options["activation_checkpointing_policy"] = {Block}
    fabric = Fabric(accelerator="cpu", devices=world, strategy=ThunderFSDPStrategy(**options))
    fabric.launch()
    model = fabric.setup_module(fresh_gpt(layers))
    opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))
    return fabric, model, opt


def _fsdp2(world: int, layers: int, reshard: bool, checkpointed: bool) -> tuple[Any, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    m = fresh_gpt(layers)
    for i, block in enumerate(m.transformer.h):
        if checkpointed:
            block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            m.transformer.h[i] = block
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    return m, torch.optim.SGD(m.parameters(), lr=1e-3)


def _bench(rank: int, world: int, warmup: int, rounds: int, layers: int) -> dict[str, Any]:
    import thunder

    from thunderviz import capture
    from thunderviz.parallel.buckets import find_blocks

    memory: dict[str, dict[str, int]] = {}
    ours_models: dict[str, tuple[Any, Any, Any]] = {}
    for sharding in ("ZERO2", "ZERO3"):
        for ck in (False, True):
            fabric, model, opt = _ours(world, layers, sharding, ck)
            name = f"ours {sharding}{' + checkpointing' if ck else ''}"
            memory[name] = measure_memory(model, opt, model, fabric.backward, rank)
            memory[name]["saved_by_trace"] = capture(model, stages=False).saved_for_backward["bytes"]
            ours_models[name] = (fabric, model, opt)
    torch_models: dict[str, tuple[Any, Any]] = {}
    for reshard in (False, True):
        for ck in (False, True):
            m, opt = _fsdp2(world, layers, reshard, ck)
            name = f"FSDP2 reshard={reshard}{' + checkpoint_wrapper' if ck else ''}"
            memory[name] = measure_memory(m, opt, m, lambda loss: loss.backward(), rank)
            torch_models[name] = (m, opt)

    # (b) accumulation: ours ZERO2 (the same model, with and without no_backward_sync) and FSDP2 reshard=False
    fabric, model, opt = ours_models["ours ZERO2"]
    fsdp2, fsdp2_opt = torch_models["FSDP2 reshard=False"]
    jit_model = thunder.jit(fresh_gpt(layers))
    jit_opt = torch.optim.SGD(jit_model.parameters(), lr=1e-3)
    eager = fresh_gpt(layers)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=1e-3)

    def ours_step(accumulate: bool) -> Any:
        def step(i: int, each: Any = None) -> None:
            for m in range(MICRO):
                if each is not None:
                    each()
                x, y = batch(rank, MICRO * i + m)
                with fabric.no_backward_sync(model, enabled=accumulate and m < MICRO - 1):
                    fabric.backward(loss_of(model(x), y) / MICRO)
            opt.step()
            opt.zero_grad()

        return step

    def fsdp2_step(accumulate: bool) -> Any:
        def step(i: int, each: Any = None) -> None:
            for m in range(MICRO):
                if each is not None:
                    each()
                fsdp2.set_requires_gradient_sync(not accumulate or m == MICRO - 1)
                x, y = batch(rank, MICRO * i + m)
                (loss_of(fsdp2(x), y) / MICRO).backward()
            fsdp2_opt.step()
            fsdp2_opt.zero_grad()

        return step

    def one_process(m: Any, o: Any) -> Any:
        def step(i: int) -> None:
            for k in range(MICRO):
                x, y = batch(rank, MICRO * i + k)
                (loss_of(m(x), y) / MICRO).backward()
            o.step()
            o.zero_grad()

        return step

    steps = {
        "ours ZERO2, no_backward_sync": ours_step(True),
        "ours ZERO2, sync every micro-batch": ours_step(False),
        "FSDP2, set_requires_gradient_sync(False)": fsdp2_step(True),
        "FSDP2, sync every micro-batch": fsdp2_step(False),
        "1-process thunder.jit": one_process(jit_model, jit_opt),
        "1-process eager": one_process(eager, eager_opt),
    }
    from comm_overhead import _c10d_calls, interleave_timed

    times = interleave_timed(steps, warmup=warmup, rounds=rounds)
    calls, c10d = {}, {}
    for name, step in steps.items():
        if "1-process" not in name:
            with counting_collectives() as counts:
                step(warmup + rounds)
            calls[name] = dict(counts)
            c10d[name] = _c10d_calls(step, warmup + rounds + 1)  # the same step seen from c10d: nothing uncounted
    accumulation_memory = {}
    for name in ("ours ZERO2, no_backward_sync", "ours ZERO2, sync every micro-batch"):
        accumulation_memory[name] = _step_peak(steps[name], model, opt, rank)
    for name in ("FSDP2, set_requires_gradient_sync(False)", "FSDP2, sync every micro-batch"):
        accumulation_memory[name] = _step_peak(steps[name], fsdp2, fsdp2_opt, rank)
    x, y = batch(rank, 0)
    with fabric.no_backward_sync(model, enabled=True):
        fabric.backward(loss_of(model(x), y))
    kept = capture(model, stages=False).accumulated_gradients  # the accumulating backward ran last
    fabric.backward(loss_of(model(x), y))
    opt.zero_grad()
    return {
        "memory": memory,
        "times": times,
        "calls": calls,
        "c10d": c10d,
        "accumulation_memory": accumulation_memory,
        "kept": kept,
        "buckets": len(find_blocks(fresh_gpt(layers))) + 1,
    }


def _step_peak(step: Any, model: Any, opt: Any, rank: int) -> int:
    """The peak of one optimizer step (MICRO micro-batches), under MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        step(10_000, mt.reset_mod_stats)  # the tracker refuses a second call of a module unless its stats are reset
    return _total(mt.get_tracker_snapshot("peak"))


# -- the report -----------------------------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _memory_report(ranks: list[dict[str, Any]]) -> list[str]:
    """Both ranks' memory side by side, and the checkpointing reduction of ours against torch's, per rank."""
    mems = [r["memory"] for r in ranks]
    per_rank = " / ".join(f"r{i}" for i in range(len(ranks)))
    lines = [
        f"(a) activation checkpointing, one training step per variant, MemTracker on CPU, per rank ({per_rank})",
        "",
    ]
    lines.append(
        f"| variant | held for backward ({per_rank}) | peak of the step ({per_rank}) | saved by the forward trace |"
    )
    lines.append("|---|---|---|---|")
    for name in mems[0]:
        held = " / ".join(_mib(m[name]["held_for_backward"]) for m in mems)
        peak = " / ".join(_mib(m[name]["peak"]) for m in mems)
        saved = " / ".join(_mib(m[name]["saved_by_trace"]) for m in mems) if "saved_by_trace" in mems[0][name] else ""
        lines.append(f"| {name} | {held} | {peak} | {saved} |")
    lines += ["", "held for backward = tensor bytes allocated after forward minus before (gathered parameters kept for"]
    lines += [
        "backward + saved activations + the logits); saved by the forward trace = thunder's own count (ours only)",
        "",
    ]
    pairs = [
        ("ours ZERO2", "FSDP2 reshard=False", " + checkpointing", " + checkpoint_wrapper"),
        ("ours ZERO3", "FSDP2 reshard=True", " + checkpointing", " + checkpoint_wrapper"),
    ]
    for ours, theirs, ours_ck, theirs_ck in pairs:
        for rank, mem in enumerate(mems):
            oh, oh_ck = mem[ours]["held_for_backward"], mem[ours + ours_ck]["held_for_backward"]
            th, th_ck = mem[theirs]["held_for_backward"], mem[theirs + theirs_ck]["held_for_backward"]
            op = mem[ours]["peak"] / mem[ours + ours_ck]["peak"]
            tp = mem[theirs]["peak"] / mem[theirs + theirs_ck]["peak"]
            so = mem[ours]["saved_by_trace"] / mem[ours + ours_ck]["saved_by_trace"]
            factor, removed = (oh / oh_ck) / (th / th_ck), (oh - oh_ck) - (th - th_ck)
            lines.append(
                f"rank {rank} {ours} vs {theirs}: checkpointing cuts what is held for backward {oh / oh_ck:.2f}x"
                f" ({_mib(oh)} -> {_mib(oh_ck)}; saved by the trace {so:.2f}x), peak {op:.2f}x;"
                f" torch: {th / th_ck:.2f}x ({_mib(th)} -> {_mib(th_ck)}), peak {tp:.2f}x."
                f" Ours/torch reduction factor {factor:.2f}, bytes removed ours - torch {removed / 2**20:+.2f} MiB:"
                " target (ours >= torch's)"
                f" {_verdict(factor >= 1 and removed >= 0)}"
            )
    return lines


def _paired(times: list[dict[str, Any]], name: str, base: str | None, kind: str) -> list[float]:
    """Per round: ``name``'s step minus ``base``'s in the same round (ms), CPU time averaged over the ranks.

    The two ran seconds apart within one interleaved round, so the machine's load mostly cancels in the difference.
    """
    k = 1 if kind == "wall" else len(times)  # wall is barrier-bounded, the same on every rank
    n = len(times[0][name][kind])
    out = []
    for i in range(n):
        v = sum(t[name][kind][i] for t in times[:k]) / k
        b = sum(t[base][kind][i] for t in times[:k]) / k if base else 0.0
        out.append((v - b) * 1e3)
    return out


def _spread(values: list[float]) -> tuple[float, float, float]:
    """Median and quartiles (the quartiles collapse to the median with fewer than 2 rounds)."""
    med = statistics.median(values)
    if len(values) < 2:
        return med, med, med
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return med, q1, q3


def _fmt(s: tuple[float, float, float]) -> str:
    return f"{s[0]:.1f} [{s[1]:.1f}, {s[2]:.1f}]"


def _accumulation_report(ranks: list[dict[str, Any]]) -> list[str]:
    r = ranks[0]
    times = [x["times"] for x in ranks]
    n = len(times[0][next(iter(times[0]))]["wall"])
    ours_acc, ours_sync = "ours ZERO2, no_backward_sync", "ours ZERO2, sync every micro-batch"
    t_acc, t_sync = "FSDP2, set_requires_gradient_sync(False)", "FSDP2, sync every micro-batch"
    lines = [
        f"(b) accumulation of {MICRO} micro-batches per optimizer step: {n} interleaved rounds, medians [quartiles]",
        "in ms; CPU = process time (all threads, gloo's included) averaged over the ranks; overhead = the variant's",
        "step minus its 1-process baseline's step in the same round (ours: thunder.jit, torch's: eager)",
        "",
        "| variant | optimizer step, wall | CPU | distributed overhead, wall | CPU"
        " | collectives per step (torch.distributed calls) | c10d ops (profiler) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in times[0]:
        base = (
            None if "1-process" in name else ("1-process thunder.jit" if name.startswith("ours") else "1-process eager")
        )
        wall, cpu = _spread(_paired(times, name, None, "wall")), _spread(_paired(times, name, None, "cpu"))
        ow = _fmt(_spread(_paired(times, name, base, "wall"))) if base else ""
        oc = _fmt(_spread(_paired(times, name, base, "cpu"))) if base else ""
        calls = ", ".join(f"{v} {k}" for k, v in sorted(r["calls"].get(name, {}).items()))
        c10d = ", ".join(f"{v} {k}" for k, v in sorted(r["c10d"].get(name, {}).items()))
        lines.append(f"| {name} | {_fmt(wall)} | {_fmt(cpu)} | {ow} | {oc} | {calls} | {c10d} |")
    lines.append("")

    # -- collectives
    buckets = r["buckets"]
    for rank, x in enumerate(ranks):
        rs = x["calls"][ours_acc].get("reduce_scatter_tensor", 0)
        ag, tag = (
            x["calls"][ours_acc].get("all_gather_into_tensor", 0),
            x["calls"][t_acc].get("all_gather_into_tensor", 0),
        )
        trs = x["calls"][t_acc].get("reduce_scatter_tensor", 0)
        lines.append(
            f"rank {rank} collectives per optimizer step with accumulation: ours {rs} reduce_scatter for {buckets}"
            f" buckets (target buckets x 1 = {buckets}: {_verdict(rs == buckets)}), FSDP2 {trs}; all_gathers ours"
            f" {ag}, FSDP2 {tag} (one per bucket per micro-batch forward in both)"
        )
    c10d_total = {k: sum(v.values()) for k, v in r["c10d"].items()}
    dist_total = {k: sum(v.values()) for k, v in r["calls"].items()}
    lines.append(
        "torch.distributed calls and the profiler's c10d ops agree in number for every variant: "
        + ("yes" if c10d_total == dist_total else f"NO ({dist_total} vs {c10d_total})")
    )

    # -- time
    def diff(a: str, b: str, kind: str) -> tuple[float, float, float]:
        return _spread(_paired(times, a, b, kind))

    for ours_or_torch, acc, sync in (("ours", ours_acc, ours_sync), ("FSDP2", t_acc, t_sync)):
        lines.append(
            f"{ours_or_torch}: accumulating minus syncing every micro-batch, per step: wall"
            f" {_fmt(diff(acc, sync, 'wall'))} ms, CPU {_fmt(diff(acc, sync, 'cpu'))} ms"
        )
    for kind in ("wall", "cpu"):
        o = _spread(_paired(times, ours_acc, "1-process thunder.jit", kind))
        t = _spread(_paired(times, t_acc, "1-process eager", kind))
        ratio = f"{o[0] / t[0]:.2f}" if t[0] > 0 else "n/a (FSDP2's overhead <= 0)"
        overlap = " (the quartile ranges overlap: within this run's noise)" if o[1] <= t[2] and t[1] <= o[2] else ""
        lines.append(
            f"distributed overhead with accumulation, {kind}: ours {_fmt(o)} ms vs FSDP2 {_fmt(t)} ms, ours/FSDP2"
            f" {ratio}: target (ours <= FSDP2's) {_verdict(o[0] <= t[0])}{overlap}"
        )
    lines.append(
        f"step ours accumulating minus FSDP2 accumulating: wall {_fmt(diff(ours_acc, t_acc, 'wall'))} ms, CPU"
        f" {_fmt(diff(ours_acc, t_acc, 'cpu'))} ms"
    )

    # -- memory
    acc = r["accumulation_memory"]
    lines.append(
        "peak of an optimizer step (rank 0): ours "
        f"{_mib(acc[ours_acc])} accumulating vs {_mib(acc[ours_sync])} syncing; FSDP2 {_mib(acc[t_acc])} vs"
        f" {_mib(acc[t_sync])}; ours keeps {_mib(r['kept']['bytes'])} of unsharded gradients"
        f" ({r['kept']['params']} parameters in {r['kept']['buckets']} buckets) between micro-batches"
    )
    return lines


def table(ranks: list[dict[str, Any]], load: str) -> str:
    return "\n".join([load, "", *_memory_report(ranks), "", *_accumulation_report(ranks)])


def main() -> None:
    import argparse

    from thunderviz.pool.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    if args.layers < 6:
        parser.error(f"--layers {args.layers}: the comparison is specified on at least 6 layers")
    before = os.getloadavg()
    results = run_ranks(_bench, args.warmup, args.rounds, args.layers, timeout=3600)
    after = os.getloadavg()
    load = (
        f"litgpt GPT, {args.layers} layers, d=128; 2 CPU ranks (gloo, 1 thread each); warmup {args.warmup},"
        f" rounds {args.rounds}; 1-min load average {before[0]:.2f} before, {after[0]:.2f} after, on"
        f" {os.cpu_count()} CPUs"
    )
    print(table(results, load), flush=True)


if __name__ == "__main__":
    main()

"""Distributed overhead of our DDP / FSDP against torch's DistributedDataParallel / FSDP2, side by side in one run.

Run: .venv/bin/python bench/comm_overhead.py [--rounds N] [--warmup N] [--profile] [--hybrid]

Tiny GPT (4 blocks, d=128), batch 8x64 per rank, 2 CPU ranks on gloo, one thread per rank. Every variant lives in
the same two processes and their steps are interleaved round by round, so machine noise hits all alike:

- ``ThunderDDPStrategy`` (gradient buckets of 25 MB) vs ``torch.nn.parallel.DistributedDataParallel``;
- ``ThunderFSDPStrategy`` ZERO2 / ZERO3 x bucketing NONE / BLOCK vs FSDP2 (``fully_shard`` per block, then the
  root) with ``reshard_after_forward`` False (ZERO2's peer) / True (ZERO3's peer);
- one-process baselines in the same processes: ``thunder.jit(model)`` for ours, eager for torch's.

Distributed overhead = 2-rank step - 1-process step (medians). Target: ours/torch <= 1.0 for DDP and for FSDP BLOCK
(ZERO2 and ZERO3), and collectives per step <= torch's. Collectives per step are counted twice for ours (the
executed forward + backward traces, and torch.profiler's ``c10d::`` calls in one step) and once for torch's
(profiler). Also printed: what each of our variants saves for backward and thunder's peak-memory estimates of its
executed traces (ZERO3 against ZERO2). ``--profile`` adds the ops that take the most time in one step of each
thunder variant.

``--hybrid``: 4 CPU ranks as 2 "hosts" of 2 (ranks 0-1 and 2-3), the same model and batch: ours hybrid
(``sharding_strategy='_HYBRID_SHARD_ZERO2'`` / ``'HYBRID_SHARD'``, ``device_mesh=(2, 2)``, BLOCK) against torch's
FSDP2 on a 2-D mesh (``fully_shard(mesh=init_device_mesh("cpu", (2, 2)))``, HSDP) and ours FSDP over all 4 ranks,
with what each host sends to the other per step (``parallel.plan``'s ring accounting, from our executed traces'
buckets).
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

FSDP_VARIANTS = [("ZERO2", "NONE"), ("ZERO2", "BLOCK"), ("ZERO3", "NONE"), ("ZERO3", "BLOCK")]
_C10D_SKIP = ("barrier", "wait", "monitored_barrier")


def interleave_timed(steps: dict[str, Any], *, warmup: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall time and this process's CPU time (all its threads, gloo's included) per step, variants interleaved.

    CPU time is reported next to wall time because this machine is shared: under load, wall time mostly measures
    how long the scheduler kept a rank waiting, while CPU time still measures the work a variant does per step.
    """
    import time

    import torch.distributed as dist

    for i in range(warmup):
        for fn in steps.values():
            fn(i)
    out: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in steps}
    for i in range(rounds):
        order = list(steps.items()) if i % 2 == 0 else list(reversed(steps.items()))
        for name, fn in order:
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            fn(warmup + i)
            dist.barrier()
            out[name]["wall"].append(time.perf_counter() - w0)
            out[name]["cpu"].append(time.process_time() - c0)
    return out


def _c10d_calls(step: Any, i: int) -> dict[str, int]:
    """Collectives one call of ``step`` issues, from torch.profiler's ``c10d::`` ops (where the rank issues them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(i)
    counts: dict[str, int] = {}
    for e in prof.events():
        if e.name.startswith("c10d::") and not any(s in e.name for s in _C10D_SKIP):
            name = e.name[len("c10d::") :]
            counts[name] = counts.get(name, 0) + 1
    return counts


def _trace_collectives(jitted: Any) -> dict[str, int]:
    import thunder
    from thunder.executors import torchex

    ids = {
        torchex.all_gather_prim_impl.id: "all_gather",
        torchex.reduce_scatter_prim_impl.id: "reduce_scatter",
        torchex.all_reduce_prim_impl.id: "all_reduce",
    }
    counts: dict[str, int] = {}
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        for bsym in trace.bound_symbols:
            kind = ids.get(bsym.sym.id)
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def _memory_facts(jitted: Any) -> dict[str, int]:
    """What forward saves for backward, and thunder's peak-memory estimates of the executed traces, in bytes."""
    import thunder

    from thunderviz.thunder import compile_state

    fw, bw = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    saved = compile_state.saved_for_backward(fw)
    return {
        "saved_tensors": len(saved),
        "saved_bytes": sum(b for *_, b in saved),
        "peak_forward": compile_state.estimated_peak_bytes(fw),
        "peak_backward": compile_state.estimated_peak_bytes(bw),
    }


def _schedule(jitted: Any) -> list[str]:
    """Where each bucket's collective is issued and waited for: the overlap evidence, in non-bookkeeping ops."""
    import thunder

    from thunderviz.thunder import compile_state

    skip = {"python_del", "clear_mutable_collection", "unpack_trivial", "unpack_sequence", "python_return"}
    out = []
    for label, trace in (
        ("forward", thunder.last_traces(jitted)[-1]),
        ("backward", thunder.last_backward_traces(jitted)[-1]),
    ):
        work = [i for i, b in enumerate(trace.bound_symbols) if b.sym.name not in skip]
        pos = {i: n for n, i in enumerate(work)}
        total = len(work)
        for b in compile_state.trace_buckets(trace):
            out.append(
                f"{label} {b.kind} {b.label} ({len(b.params)} params, {b.bytes / 1024:.0f} KiB): issued at op"
                f" {pos.get(b.issue_index, '?')}, waited at op {pos.get(b.wait_index, '?')} of {total}"
            )
    return out


def _top_ops(step: Any, i: int, n: int = 8) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(i)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
    return [(r.key, r.self_cpu_time_total / 1e3) for r in rows]


def _bench(rank: int, world: int, warmup: int, rounds: int, profile_ops: bool) -> dict[str, Any]:
    import thunder
    from _steps import batch_for, fresh_gpt, gpt_loss
    from lightning.fabric import Fabric
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy

    steps: dict[str, Any] = {}
    jitted: dict[str, Any] = {}

    def fabric_step(fabric: Any, model: Any, opt: Any) -> Any:
        def step(i: int) -> None:
            x, y = batch_for(rank, i)
            opt.zero_grad()
            fabric.backward(gpt_loss(model(x), y))
            opt.step()

        return step

    def plain_step(model: Any, opt: Any) -> Any:
        def step(i: int) -> None:
            x, y = batch_for(rank, i)
            opt.zero_grad()
            gpt_loss(model(x), y).backward()
            opt.step()

        return step

    fabric = Fabric(accelerator="cpu", devices=world, strategy=ThunderDDPStrategy(bucket_size_in_mb=25.0))
    fabric.launch()
    model = fabric.setup_module(fresh_gpt())
    steps["ours DDP"] = fabric_step(
        fabric, model, fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))
    )
    jitted["ours DDP"] = model._forward_module

    for sharding, bucketing in FSDP_VARIANTS:
        strategy = ThunderFSDPStrategy(sharding_strategy=sharding, bucketing_strategy=bucketing)
        fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
        fabric.launch()
        model = fabric.setup_module(fresh_gpt())
        opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))
        name = f"ours FSDP {sharding} {bucketing}"
        steps[name] = fabric_step(fabric, model, opt)
        jitted[name] = model._forward_module

    ddp = DistributedDataParallel(fresh_gpt())
    steps["torch DDP"] = plain_step(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    mesh = init_device_mesh("cpu", (world,))
    for reshard in (False, True):
        m = fresh_gpt()
        for block in m.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
        steps[f"torch FSDP2 reshard={reshard}"] = plain_step(m, torch.optim.SGD(m.parameters(), lr=1e-3))

    jit_model = thunder.jit(fresh_gpt())
    steps["1-process thunder.jit"] = plain_step(jit_model, torch.optim.SGD(jit_model.parameters(), lr=1e-3))
    eager = fresh_gpt()
    steps["1-process eager"] = plain_step(eager, torch.optim.SGD(eager.parameters(), lr=1e-3))

    times = interleave_timed(steps, warmup=warmup, rounds=rounds)
    calls = {name: _c10d_calls(step, warmup + rounds) for name, step in steps.items() if "1-process" not in name}
    traced = {name: _trace_collectives(j) for name, j in jitted.items()}
    memory = {name: _memory_facts(j) for name, j in jitted.items()}
    schedule = {name: _schedule(jitted[name]) for name in ("ours DDP", "ours FSDP ZERO3 BLOCK")}
    top = {name: _top_ops(steps[name], warmup + rounds + 1) for name in jitted} if profile_ops else {}
    return {"times": times, "calls": calls, "traced": traced, "memory": memory, "schedule": schedule, "top": top}


HYBRID_VARIANTS = [("ZERO2", "_HYBRID_SHARD_ZERO2"), ("ZERO3", "HYBRID_SHARD")]
HOSTS = 2


def _across_hosts(jitted: Any, world: int) -> int:
    """Bytes one host sends to the other per step: ``parallel.plan``'s ring accounting of the executed buckets (a
    collective over every rank leaves each host once per ring step; hybrid's replica all_reduces leave it once per
    rank of the host; shard-group collectives stay inside)."""
    import thunder

    from thunderviz.thunder import compile_state
    from thunderviz.trace.wire import ring_bytes

    per_host = world // HOSTS
    total = 0
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        for b in compile_state.trace_buckets(trace):
            if b.mesh_group == "shard":
                continue
            if b.mesh_group == "replica":
                total += per_host * ring_bytes(b.kind, b.bytes, HOSTS)
            else:
                total += ring_bytes(b.kind, b.bytes, world)
    return total


def _bench_hybrid(rank: int, world: int, warmup: int, rounds: int) -> dict[str, Any]:
    import thunder
    from _steps import batch_for, fresh_gpt, gpt_loss
    from lightning.fabric import Fabric
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from thunderviz import ThunderFSDPStrategy

    steps: dict[str, Any] = {}
    jitted: dict[str, Any] = {}

    def step_of(model: Any, opt: Any, backward: Any) -> Any:
        def step(i: int) -> None:
            x, y = batch_for(rank, i)
            opt.zero_grad()
            backward(gpt_loss(model(x), y))
            opt.step()

        return step

    for level, hybrid in HYBRID_VARIANTS:
        for name, options in (
            (f"ours hybrid {level} BLOCK", {"sharding_strategy": hybrid, "device_mesh": (HOSTS, world // HOSTS)}),
            (f"ours FSDP {level} BLOCK", {"sharding_strategy": level}),
        ):
            fabric = Fabric(accelerator="cpu", devices=world, strategy=ThunderFSDPStrategy(**options))
            fabric.launch()
            model = fabric.setup_module(fresh_gpt())
            opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-3))
            steps[name] = step_of(model, opt, fabric.backward)
            jitted[name] = model._forward_module
    mesh = init_device_mesh("cpu", (HOSTS, world // HOSTS), mesh_dim_names=("replicate", "shard"))
    for reshard in (False, True):
        m = fresh_gpt()
        for block in m.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
        steps[f"torch FSDP2 2-D reshard={reshard}"] = step_of(m, torch.optim.SGD(m.parameters(), lr=1e-3), _backward)
    jit_model = thunder.jit(fresh_gpt())
    steps["1-process thunder.jit"] = step_of(jit_model, torch.optim.SGD(jit_model.parameters(), lr=1e-3), _backward)
    eager = fresh_gpt()
    steps["1-process eager"] = step_of(eager, torch.optim.SGD(eager.parameters(), lr=1e-3), _backward)

    times = interleave_timed(steps, warmup=warmup, rounds=rounds)
    calls = {name: _c10d_calls(step, warmup + rounds) for name, step in steps.items() if "1-process" not in name}
    across = {name: _across_hosts(j, world) for name, j in jitted.items()}
    return {"times": times, "calls": calls, "across": across, "world": world}


def _backward(loss: torch.Tensor) -> None:
    loss.backward()


def hybrid_table(result: dict[str, Any], load: str) -> str:
    times = {
        k: {kind: statistics.median(v[kind]) * 1e3 for kind in ("wall", "cpu")} for k, v in result["times"].items()
    }
    world = result["world"]
    lines = [
        f"load: {load}; {world} ranks as {HOSTS} hosts of {world // HOSTS}; medians of"
        f" {len(next(iter(result['times'].values()))['wall'])} interleaved steps, rank 0",
        (
            f"| | {world}-rank step, wall / CPU | distributed overhead, wall / CPU | ours/torch overhead, wall / CPU |"
            " sent by each host to the other per step | collectives per step |"
        ),
        "|---|---|---|---|---|---|",
    ]
    base_o, base_t = times["1-process thunder.jit"], times["1-process eager"]
    for level, _ in HYBRID_VARIANTS:
        theirs = f"torch FSDP2 2-D reshard={level == 'ZERO3'}"
        t_over = {k: times[theirs][k] - base_t[k] for k in ("wall", "cpu")}
        for ours in (f"ours hybrid {level} BLOCK", f"ours FSDP {level} BLOCK"):
            o_over = {k: times[ours][k] - base_o[k] for k in ("wall", "cpu")}
            ratio = " / ".join(f"{o_over[k] / t_over[k]:.2f}" if t_over[k] > 0 else "n/a" for k in ("wall", "cpu"))
            lines.append(
                f"| {ours} | {times[ours]['wall']:.1f} / {times[ours]['cpu']:.1f} ms |"
                f" {o_over['wall']:.1f} / {o_over['cpu']:.1f} ms | {ratio} (vs {theirs}) |"
                f" {result['across'][ours] / 1024:.1f} KiB | {_fmt_counts(result['calls'][ours])} |"
            )
        lines.append(
            f"| {theirs} | {times[theirs]['wall']:.1f} / {times[theirs]['cpu']:.1f} ms |"
            f" {t_over['wall']:.1f} / {t_over['cpu']:.1f} ms | | | {_fmt_counts(result['calls'][theirs])} |"
        )
    lines.append(
        f"1-process: thunder.jit {base_o['wall']:.1f} / {base_o['cpu']:.1f} ms, eager {base_t['wall']:.1f} /"
        f" {base_t['cpu']:.1f} ms"
    )
    return "\n".join(lines)


def _fmt_counts(c: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "none"


def table(result: dict[str, Any], load: str) -> str:
    times = {
        k: {kind: statistics.median(v[kind]) * 1e3 for kind in ("wall", "cpu")} for k, v in result["times"].items()
    }
    rows = [("ours DDP", "torch DDP")] + [
        (f"ours FSDP {s} {b}", f"torch FSDP2 reshard={s == 'ZERO3'}") for s, b in FSDP_VARIANTS
    ]
    lines = [
        f"load: {load}; medians of {len(next(iter(result['times'].values()))['wall'])} interleaved steps, rank 0",
        (
            "| | 2-rank step, wall / CPU | 1-process step, wall / CPU | distributed overhead, wall / CPU |"
            " ours/torch overhead, wall / CPU | collectives per step |"
        ),
        "|---|---|---|---|---|---|",
    ]

    def pair(d: dict[str, float]) -> str:
        return f"{d['wall']:.1f} / {d['cpu']:.1f} ms"

    done_torch: set[str] = set()
    for ours, theirs in rows:
        base_o, base_t = times["1-process thunder.jit"], times["1-process eager"]
        o_over = {k: times[ours][k] - base_o[k] for k in ("wall", "cpu")}
        t_over = {k: times[theirs][k] - base_t[k] for k in ("wall", "cpu")}
        ratio = " / ".join(f"{o_over[k] / t_over[k]:.2f}" if t_over[k] > 0 else "n/a" for k in ("wall", "cpu"))
        lines.append(
            f"| {ours} | {pair(times[ours])} | thunder.jit {pair(base_o)} | {pair(o_over)} | {ratio} (vs {theirs}) |"
            f" {_fmt_counts(result['calls'][ours])} (trace: {_fmt_counts(result['traced'][ours])}) |"
        )
        if theirs not in done_torch:
            done_torch.add(theirs)
            lines.append(
                f"| {theirs} | {pair(times[theirs])} | eager {pair(base_t)} | {pair(t_over)} | |"
                f" {_fmt_counts(result['calls'][theirs])} |"
            )
    lines.append("")
    lines.append("| ours | saved for backward (per rank) | thunder's peak estimate, forward / backward |")
    lines.append("|---|---|---|")
    for name, m in result["memory"].items():
        lines.append(
            f"| {name} | {m['saved_tensors']} tensors, {m['saved_bytes'] / 2**20:.2f} MiB |"
            f" {m['peak_forward'] / 2**20:.2f} / {m['peak_backward'] / 2**20:.2f} MiB |"
        )
    for name, rows in result["schedule"].items():
        lines.append("")
        lines.append(f"bucket schedule of {name} (positions among the trace's non-bookkeeping ops):")
        lines += [f"  {r}" for r in rows]
    for name, ops in result["top"].items():
        lines.append(f"top ops, one step of {name}: " + "; ".join(f"{k} {ms:.1f} ms" for k, ms in ops))
    return "\n".join(lines)


def main() -> None:
    import argparse

    from thunderviz.pool.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="also list the costliest ops of each thunder variant")
    parser.add_argument("--hybrid", action="store_true", help="4 ranks as 2 hosts: hybrid sharding vs FSDP2 2-D")
    args = parser.parse_args()
    before = os.getloadavg()
    if args.hybrid:
        result = run_ranks(_bench_hybrid, args.warmup, args.rounds, nproc=2 * HOSTS, timeout=3600)[0]
    else:
        result = run_ranks(_bench, args.warmup, args.rounds, args.profile, timeout=1800)[0]
    after = os.getloadavg()
    load = f"1-min load average {before[0]:.2f} before, {after[0]:.2f} after, on {os.cpu_count()} CPUs"
    print((hybrid_table if args.hybrid else table)(result, load), flush=True)


if __name__ == "__main__":
    main()

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
    call ``all_gather_into_tensor`` / ``reduce_scatter_tensor``); steps are interleaved round by round. Target:
    reduce_scatters per step = buckets x 1, and our distributed overhead with accumulation <= FSDP2's.
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
    """One step under MemTracker: bytes held from the end of forward to backward, and the step's peak."""
    from torch.distributed._tools.mem_tracker import MemTracker

    x, y = batch(rank, 0)
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
        def step(i: int) -> None:
            for m in range(MICRO):
                x, y = batch(rank, MICRO * i + m)
                with fabric.no_backward_sync(model, enabled=accumulate and m < MICRO - 1):
                    fabric.backward(loss_of(model(x), y) / MICRO)
            opt.step()
            opt.zero_grad()

        return step

    def fsdp2_step(accumulate: bool) -> Any:
        def step(i: int) -> None:
            for m in range(MICRO):
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
    from comm_overhead import interleave_timed

    times = interleave_timed(steps, warmup=warmup, rounds=rounds)
    calls = {}
    for name, step in steps.items():
        if "1-process" not in name:
            with counting_collectives() as counts:
                step(warmup + rounds)
            calls[name] = dict(counts)
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
        "accumulation_memory": accumulation_memory,
        "kept": kept,
        "buckets": len(find_blocks(fresh_gpt(layers))) + 1,
    }


def _step_peak(step: Any, model: Any, opt: Any, rank: int) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        step(10_000)
    return _total(mt.get_tracker_snapshot("peak"))


# -- the report -----------------------------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def table(r: dict[str, Any], load: str) -> str:
    mem = r["memory"]
    lines = [load, "", "(a) activation checkpointing, one step, rank 0", ""]
    lines.append("| variant | held for backward | peak of the step | saved by the forward trace |")
    lines.append("|---|---|---|---|")
    for name, m in mem.items():
        saved = _mib(m["saved_by_trace"]) if "saved_by_trace" in m else ""
        lines.append(f"| {name} | {_mib(m['held_for_backward'])} | {_mib(m['peak'])} | {saved} |")
    lines.append("")
    pairs = [
        ("ours ZERO2", "FSDP2 reshard=False", " + checkpointing", " + checkpoint_wrapper"),
        ("ours ZERO3", "FSDP2 reshard=True", " + checkpointing", " + checkpoint_wrapper"),
    ]
    for ours, theirs, ours_ck, theirs_ck in pairs:
        o = mem[ours]["held_for_backward"] / mem[ours + ours_ck]["held_for_backward"]
        t = mem[theirs]["held_for_backward"] / mem[theirs + theirs_ck]["held_for_backward"]
        op = mem[ours]["peak"] / mem[ours + ours_ck]["peak"]
        tp = mem[theirs]["peak"] / mem[theirs + theirs_ck]["peak"]
        so = mem[ours]["saved_by_trace"] / mem[ours + ours_ck]["saved_by_trace"]
        lines.append(
            f"{ours}: checkpointing cuts what is held for backward {o:.2f}x (saved by the trace {so:.2f}x), the peak"
            f" {op:.2f}x; {theirs}: {t:.2f}x, peak {tp:.2f}x; ours/torch reduction {o / t:.2f} (target >= 1)"
        )
    times = {k: statistics.median(v["wall"]) * 1e3 for k, v in r["times"].items()}
    cpu = {k: statistics.median(v["cpu"]) * 1e3 for k, v in r["times"].items()}
    n = len(next(iter(r["times"].values()))["wall"])
    lines += ["", f"(b) accumulation of {MICRO} micro-batches per optimizer step, medians of {n} interleaved steps", ""]
    lines.append("| variant | optimizer step, wall / CPU | distributed overhead, wall / CPU | collectives per step |")
    lines.append("|---|---|---|---|")
    for name in times:
        base = "1-process thunder.jit" if name.startswith("ours") else "1-process eager"
        over = ""
        if "1-process" not in name:
            over = f"{times[name] - times[base]:.1f} / {cpu[name] - cpu[base]:.1f} ms"
        calls = ", ".join(f"{v} {k}" for k, v in sorted(r["calls"].get(name, {}).items()))
        lines.append(f"| {name} | {times[name]:.1f} / {cpu[name]:.1f} ms | {over} | {calls} |")

    def overhead(name: str, base: str, kind: dict[str, float]) -> float:
        return kind[name] - kind[base]

    ow = overhead("ours ZERO2, no_backward_sync", "1-process thunder.jit", times)
    oc = overhead("ours ZERO2, no_backward_sync", "1-process thunder.jit", cpu)
    tw = overhead("FSDP2, set_requires_gradient_sync(False)", "1-process eager", times)
    tc = overhead("FSDP2, set_requires_gradient_sync(False)", "1-process eager", cpu)
    rs = r["calls"]["ours ZERO2, no_backward_sync"].get("reduce_scatter_tensor", 0)
    lines.append("")
    lines.append(
        f"ours with accumulation: {rs} reduce_scatter per optimizer step for {r['buckets']} buckets (target"
        f" buckets x 1); distributed overhead ours/FSDP2 {ow / tw:.2f} wall, {oc / tc:.2f} CPU (target <= 1)"
    )
    acc = r["accumulation_memory"]
    lines.append(
        "peak of an optimizer step: ours "
        f"{_mib(acc['ours ZERO2, no_backward_sync'])} accumulating vs {_mib(acc['ours ZERO2, sync every micro-batch'])}"
        f" syncing; FSDP2 {_mib(acc['FSDP2, set_requires_gradient_sync(False)'])} vs"
        f" {_mib(acc['FSDP2, sync every micro-batch'])}; ours keeps {_mib(r['kept']['bytes'])} of unsharded gradients"
        f" ({r['kept']['params']} parameters in {r['kept']['buckets']} buckets) between micro-batches"
    )
    return "\n".join(lines)


def main() -> None:
    import argparse

    from thunderviz.ranks.spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    before = os.getloadavg()
    result = run_ranks(_bench, args.warmup, args.rounds, args.layers, timeout=3600)[0]
    after = os.getloadavg()
    load = f"1-min load average {before[0]:.2f} before, {after[0]:.2f} after, on {os.cpu_count()} CPUs"
    print(table(result, load), flush=True)


if __name__ == "__main__":
    main()

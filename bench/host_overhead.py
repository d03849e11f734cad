"""Host CPU time per training step on a host-bound CPU proxy: what thunder costs, and what our strategies add to it.

Run: python bench/host_overhead.py [--rounds N] [--worlds 1,2] [--only DDP,ZERO2,...] [--one-bucket]

Why a CPU proxy: on an H200 (bench/device_check.sh step 4, GPT d=1024 x 8 layers) the kernels of every variant take
about eager's time and the step is bound by Python on the host. A model with the same structure but tiny tensors
(TinyGPT, 8 blocks, d=32, batch 1x8, vocab 256, AdamW ``fused=True``) makes the step *all* host time, so the host
time one step costs can be measured on any CPU: this is what the GPU step waits for, without a GPU.

What is measured, per steady step, as the calling thread's CPU time (``time.thread_time``: load from other
processes disturbs it far less than wall time; gloo's own threads are not counted, as the GPU's kernels are not):

- eager; one-process ``thunder.jit`` with the executors the strategies decide on a GPU without nvFuser
  (``sdpa, torchcompile, torch``); ours DDP, FSDP ZERO2 BLOCK and ZERO3 BLOCK with the same executors. World 1 is
  one process, world 2 two gloo ranks; the one-process ``thunder.jit`` runs beside them in each rank process (its
  own copy, no communication), and every ratio is to it. Variants are interleaved round by round (one step each,
  in alternating order) and medians are printed with the load average.
- with ``--one-bucket``, also FSDP ZERO2 and ZERO3 with every parameter in one bucket (the same blocks held in a
  container that BLOCK bucketing does not take for a list of blocks, so all of them fall in the root bucket): what
  fewer, larger buckets would buy on this proxy, two collectives a step instead of one per block and direction. It
  gives up the overlap of each block's collective with its neighbour's compute, which the proxy cannot price.
- a split per phase, from separate instrumented steps (medians per phase; the instrumentation adds a little per
  call, so the phases sum to slightly more than the plain step): thunder's prologue (the checks on every input),
  the fusion regions' calls (``TorchCompileN``), our pack/unpack ops, collectives' issue and wait, the optimizer
  step, and the rest (thunder's call machinery, autograd, Fabric's wrapper, ops outside regions, the loss).

How the split is taken: every callable the executed forward and backward traces call by name (regions, our ops,
collective prims) and each cache entry's prologue is wrapped, for the instrumented steps only, in a timer of the
thread's CPU time. torch.profiler was the alternative: it times ranges in wall time (inflated by the load this
machine shares) and sees no boundary between our pack/unpack and the aten ops inside them; thunder 0.2.6's own
hooks (``cs.last_trace_host_*``, ``thunder.core.profile``) give whole-call wall times or NVTX ranges only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXECUTORS = ["sdpa", "torchcompile", "torch"]
OURS = ("DDP", "ZERO2", "ZERO3")
PHASES = ("prologue", "regions", "pack/unpack", "issue", "wait", "optimizer", "rest")
REFERENCE = "thunder.jit"


# -- the per-phase timers ---------------------------------------------------------------------------------------


class PhaseClock:
    """Thread CPU time per phase, accumulated by wrappers around the callables a jitted step calls."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(PHASES, 0)
        self._undo: list[Callable[[], None]] = []

    def timed(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        spent, calls, clock = self.spent, self.calls, time.thread_time

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase] += clock() - t0
                calls[phase] += 1

        return wrapper

    def instrument(self, jitted: Any) -> None:
        """Wrap the prologue of every cache entry of ``jitted`` and what its traces call by name."""
        import thunder

        cache = thunder.compile_stats(jitted).interpreter_cache
        originals = list(cache)
        for i, entry in enumerate(originals):
            cache[i] = entry._replace(prologue_fn=self.timed(entry.prologue_fn, "prologue"))
            for fn in (entry.computation_fn, entry.backward_fn):
                if fn is not None:
                    self._instrument_globals(_trace_function(fn).__globals__)

        self._undo.append(lambda: cache.__setitem__(slice(None), originals))

    def _instrument_globals(self, names: dict[str, Any]) -> None:
        for name, value in list(names.items()):
            phase = _phase_of(name)
            if phase is not None and callable(value):
                names[name] = self.timed(value, phase)
                self._undo.append(lambda names=names, name=name, value=value: names.__setitem__(name, value))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _phase_of(name: str) -> str | None:
    if name.startswith("TorchCompile"):
        return "regions"
    if name.startswith("thunderviz_"):
        return "pack/unpack"
    if name == "torch_wait_prim_impl":
        return "wait"
    if (
        name.startswith("torch_")
        and name.endswith("_prim_impl")
        and any(c in name for c in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"))
    ):
        return "issue"
    return None


def _trace_function(fn: Any) -> Any:
    """The function thunder generated from a trace, under its decorators (no_grad, no_autocast)."""
    from thunderviz.thunder.jit.direct_regions import find_wrapped

    def generated(f: Any) -> bool:
        code = getattr(f, "__code__", None)
        return code is not None and code.co_filename.startswith("thunder.")

    found = find_wrapped(fn, generated)
    if found is None:
        raise RuntimeError(f"no thunder-generated function found under {fn!r}: thunder's trace callables changed")
    return found


# -- the variants -----------------------------------------------------------------------------------------------


def _blocks_unlisted(blocks: Any) -> Any:
    """``blocks`` (an ``nn.ModuleList``) as a plain module that iterates them: no list of blocks for bucketing."""
    import torch

    class UnlistedBlocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, block in enumerate(blocks):
                self.add_module(str(i), block)

        def __iter__(self) -> Any:
            return iter(self._modules.values())

    return UnlistedBlocks()


def job(
    rank: int, world: int, only: tuple[str, ...], rounds: int, split_steps: int, one_bucket: bool = False
) -> dict[str, Any]:
    """Runs in each rank process: builds every variant, times interleaved steps, then the instrumented split."""
    import thunder
    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.thunder.modules import unwrap_fabric

    x, y = make_batch(batch=1, block_size=8, vocab_size=256, seed=rank)

    def adamw(params: Any) -> Any:
        # fused: on a GPU torch's default (foreach) launches a few multi-tensor kernels per step; on CPU its default
        # is a Python loop per parameter (10.7 ms per step here) and foreach still loops per tensor in C++ (5.5 ms),
        # where fused is one call (1.7 ms): the nearest to the GPU's host cost, and the same in every variant
        return torch.optim.AdamW(params, lr=1e-4, fused=True)

    def build(unlisted: bool = False) -> Any:
        torch.manual_seed(0)
        model = TinyGPT(vocab_size=256, block_size=8, d_model=32, n_layer=8, n_head=4)
        if unlisted:
            model.blocks = _blocks_unlisted(model.blocks)
        return model

    def plain(wrap: Callable[[Any], Any]) -> tuple[Any, Any, Any, Any]:
        model = build()
        jitted = wrap(model)
        return jitted, adamw(model.parameters()), torch.Tensor.backward, jitted

    def ours(strategy: Any, unlisted: bool = False) -> tuple[Any, Any, Any, Any]:
        fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
        fabric.launch()
        model = fabric.setup_module(build(unlisted))
        opt = fabric.setup_optimizers(adamw(model.parameters()))
        return model, opt, fabric.backward, unwrap_fabric(model)

    makers: dict[str, Callable[[], tuple[Any, Any, Any, Any]]] = {}
    if world == 1:
        makers["eager"] = lambda: plain(lambda m: m)
    makers[REFERENCE] = lambda: plain(lambda m: thunder.jit(m, executors=EXECUTORS))
    makers["ours DDP"] = lambda: ours(ThunderDDPStrategy(executors=EXECUTORS))
    for zero in ("ZERO2", "ZERO3"):
        makers[f"ours FSDP {zero} BLOCK"] = lambda zero=zero: ours(
            ThunderFSDPStrategy(sharding_strategy=zero, bucketing_strategy="BLOCK", executors=EXECUTORS)
        )
        if one_bucket:
            makers[f"ours FSDP {zero} one bucket"] = lambda zero=zero: ours(
                ThunderFSDPStrategy(sharding_strategy=zero, bucketing_strategy="BLOCK", executors=EXECUTORS),
                unlisted=True,
            )
    if only:
        makers = {k: v for k, v in makers.items() if k in ("eager", REFERENCE) or any(o in k for o in only)}

    built = {name: make() for name, make in makers.items()}

    def step_of(model: Any, opt: Any, backward: Any, clock: PhaseClock | None = None) -> Callable[[], None]:
        opt_step = opt.step if clock is None else clock.timed(opt.step, "optimizer")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            backward(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
            opt_step()

        return step

    steps = {name: step_of(*b[:3]) for name, b in built.items()}
    for _ in range(3):  # compile, then warm every cache and allocator
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(rounds):
        order = list(steps.items()) if i % 2 == 0 else list(reversed(steps.items()))
        for name, step in order:
            if world > 1:
                dist.barrier()
            t0 = time.thread_time()
            step()
            times[name].append(time.thread_time() - t0)

    # The split: every variant instrumented, one step each per round in alternating order, as above.
    clocks = {name: PhaseClock() for name in built}
    split_steps_of = {}
    for name, (model, opt, backward, jitted) in built.items():
        if name != "eager":
            clocks[name].instrument(jitted)
        split_steps_of[name] = step_of(model, opt, backward, clocks[name])
    per_step: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in built}
    calls: dict[str, dict[str, int]] = {}
    for i in range(split_steps):
        order = list(split_steps_of.items()) if i % 2 == 0 else list(reversed(split_steps_of.items()))
        for name, step in order:
            clock = clocks[name]
            if world > 1:
                dist.barrier()
            before, before_calls = dict(clock.spent), dict(clock.calls)
            t0 = time.thread_time()
            step()
            total = time.thread_time() - t0
            parts = {p: clock.spent[p] - before[p] for p in PHASES if p != "rest"}
            for p, v in parts.items():
                per_step[name][p].append(v)
            per_step[name]["rest"].append(total - sum(parts.values()))
            calls[name] = {p: clock.calls[p] - before_calls[p] for p in PHASES}
    split: dict[str, dict[str, Any]] = {}
    for name, (_, _, _, jitted) in built.items():
        clocks[name].undo()
        split[name] = {
            "ms": {p: statistics.median(v) * 1e3 for p, v in per_step[name].items()},
            "calls": calls[name],
            "cache_entries": len(thunder.compile_stats(jitted).interpreter_cache) if name != "eager" else 0,
        }
    return {"times": times, "split": split}


# -- the report -------------------------------------------------------------------------------------------------


def table(world: int, results: list[dict[str, Any]]) -> str:
    """Rank 0's medians; with 2 ranks, the larger rank's median per variant (the step waits for it)."""
    names = list(results[0]["times"])
    host = {n: max(statistics.median(r["times"][n]) for r in results) * 1e3 for n in names}
    ref = host[REFERENCE]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    head = f"world {world} (load average {load}; rounds {len(results[0]['times'][names[0]])}, medians)"
    lines = [head, "", "| variant | host CPU per step | vs one-process thunder.jit | " + " | ".join(PHASES) + " |"]
    lines.append("|---|---|---|" + "---|" * len(PHASES))
    split = results[0]["split"]
    for n in names:
        parts = split[n]["ms"]
        calls = split[n]["calls"]
        cells = [f"{parts[p]:.2f}" + (f" ({calls[p]})" if calls.get(p) and p != "rest" else "") for p in PHASES]
        lines.append(f"| {n} | {host[n]:.2f} ms | {host[n] / ref:.2f}x | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "phases: ms per step (calls per step), rank 0, from instrumented steps; cache entries: "
        + ", ".join(f"{n} {split[n]['cache_entries']}" for n in names if n != "eager")
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed steps per variant (interleaved)")
    parser.add_argument("--split-steps", type=int, default=15, help="instrumented steps per variant")
    parser.add_argument("--worlds", default="1,2", help="comma-separated world sizes")
    parser.add_argument("--only", default="", help="comma-separated parts of our variants' names (DDP,ZERO2,ZERO3)")
    parser.add_argument(
        "--one-bucket", action="store_true", help="also FSDP with every parameter in one bucket (fewer collectives)"
    )
    args = parser.parse_args()
    from thunderviz.pool.spawn import run_ranks

    only = tuple(filter(None, args.only.split(",")))
    for world in (int(w) for w in args.worlds.split(",")):
        results = run_ranks(job, only, args.rounds, args.split_steps, args.one_bucket, nproc=world, timeout=3000)
        print(table(world, results), flush=True)
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

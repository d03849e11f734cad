"""The GPU path in one go: both strategies on NCCL (world size 1), traces on CUDA, bucketing on, in a real kernel too.

Run on a machine with one CUDA GPU: ``bench/device_check.sh`` (under 5 minutes; it prints what ran and exits 0 only
if every check passed). ``--cpu-rehearsal`` runs the very same steps on CPU with gloo, so the script itself is
tested where no GPU is lent; without CUDA and without that flag it stops at once and says so.

What runs, each in a fresh rank process (world size 1):

1. ``ThunderDDPStrategy`` (gradient buckets of 25 MB) and ``ThunderFSDPStrategy`` ZERO2 / ZERO3 with BLOCK bucketing
   on a small GPT: two optimizer steps; the loss must be finite and fall; the executed traces must hold CUDA tensors,
   one collective per bucket, and (ZERO3) gathers in backward; with nvFuser installed, fusions must appear.
2. ``%%thunder_fsdp --nproc 1 --backend nccl --sharding zero3 --bucketing block`` in a real Jupyter kernel: the same
   checks on what the rank reports, and the cell's ``RunReport`` must carry the captured traces.
3. The memory plan on the device: ``thunderviz.plan`` (made on the rank, for its device) of DDP and FSDP ZERO2 BLOCK
   against the step peak the rank measures (CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``); each
   within 10%. On CUDA the model is large enough (a peak of about 1.5 GiB) that what the prediction leaves out —
   cuBLAS's workspace (tens of MiB, allocated through the caching allocator on the first matmul), blocks the
   allocator hands out whole when the remainder is under 1 MiB — stays within that; the CPU rehearsal uses a small
   model.
4. Speed and memory against eager (the executor decision): eager, torch.compile, and our DDP and FSDP ZERO2
   BLOCK with the executors the strategy decides, on ``TinyGPT(32000, 1024, d 1024, 8 layers, 16 heads)`` in bf16,
   batch 8x1024, AdamW, world size 1: median step time of 10 steps after 3, and the peak of one steady step
   (``max_memory_allocated``), and the host CPU time of those steps. Gates on CUDA: ours <= 1.10x eager's step time
   and <= 1.0x eager's peak for DDP and FSDP ZERO2 BLOCK; FSDP ZERO3 BLOCK (CUDA only) <= 1.20x and <= 1.0x. The CPU
   rehearsal runs the same table on a small model without gates (on CPU the decided executors are thunder's defaults,
   chosen for compile time: bench/jit_decisions.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_MODEL = "TinyGPT(n_layer=2, d_model=64, n_head=4)"


def _trace_facts(jitted: Any) -> dict[str, Any]:
    """Devices, executors and collectives of the last forward and backward execution traces (runs on the rank)."""
    import thunder
    from thunder.core.proxies import TensorProxy
    from thunder.executors import torchex

    from thunderviz.thunder import compile_state

    kinds = {
        torchex.all_gather_prim_impl.id: "all_gather",
        torchex.reduce_scatter_prim_impl.id: "reduce_scatter",
        torchex.all_reduce_prim_impl.id: "all_reduce",
    }
    facts: dict[str, Any] = {"devices": set(), "executors": {}, "fusions": 0}
    for label, trace in (
        ("forward", thunder.last_traces(jitted)[-1]),
        ("backward", thunder.last_backward_traces(jitted)[-1]),
    ):
        counts: dict[str, int] = {}
        for bsym in trace.bound_symbols:
            for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
                if isinstance(p, TensorProxy):
                    facts["devices"].add(p.device.type)
            ex = getattr(bsym.sym, "executor", None)
            if ex is not None:
                facts["executors"][ex.name] = facts["executors"].get(ex.name, 0) + 1
            if bsym.sym.is_fusion:
                facts["fusions"] += 1
            kind = kinds.get(bsym.sym.id)
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
        facts[label] = counts
    facts["buckets"] = {
        k: [(b.kind, b.label, len(b.params), b.bytes) for b in v] for k, v in compile_state.comm_buckets(jitted).items()
    }
    facts["devices"] = sorted(facts["devices"])
    return facts


def _problems(name: str, facts: dict[str, Any], losses: list[float], device_type: str, nvfuser: bool) -> list[str]:
    out = []
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        out.append(f"{name}: losses {losses} are not finite and falling")
    if device_type not in facts["devices"]:
        out.append(f"{name}: the executed traces hold {facts['devices']} tensors, not {device_type}")
    fwd, bwd, buckets = facts["forward"], facts["backward"], facts["buckets"]
    if "DDP" in name:
        if bwd.get("all_reduce") != 1 or fwd:
            out.append(f"{name}: expected no forward collective and one bucketed all_reduce, got {fwd} / {bwd}")
    else:
        if fwd.get("all_gather") != len(buckets.get("forward", [])) or fwd.get("all_gather", 0) > 3:
            out.append(f"{name}: expected one forward all_gather per BLOCK bucket (root + 2 blocks), got {fwd}")
        if ("ZERO3" in name) != bool(bwd.get("all_gather")):
            out.append(f"{name}: backward all_gathers {bwd.get('all_gather', 0)} do not match the sharding")
    if nvfuser and facts["fusions"] == 0:
        out.append(f"{name}: nvFuser is installed but no fusion appears in the executed traces")
    return out


def three_steps(fabric: Any, model: Any, opt: Any, x: Any, y: Any) -> list[float]:
    """The training the check runs on every path (a strategy job and the notebook cell alike); returns the losses."""
    import torch

    losses = []
    for _ in range(3):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def strategies_job(rank: int, world: int, device_type: str) -> list[dict[str, Any]]:
    """Runs in a fresh rank process: each strategy variant, two steps, facts and problems."""
    import thunder
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch

    nvfuser = thunder.extend.get_executor("nvfuser") is not None
    rows = []

    def fsdp(sharding: str) -> Any:
        return lambda: ThunderFSDPStrategy(sharding_strategy=sharding, bucketing_strategy="BLOCK")

    variants = [
        ("ThunderDDPStrategy", lambda: ThunderDDPStrategy(bucket_size_in_mb=25.0)),
        ("ThunderFSDPStrategy ZERO2 BLOCK", fsdp("ZERO2")),
        ("ThunderFSDPStrategy ZERO3 BLOCK", fsdp("ZERO3")),
    ]
    for name, make in variants:
        t0 = time.perf_counter()
        fabric = Fabric(accelerator="cuda" if device_type == "cuda" else "cpu", devices=world, strategy=make())
        fabric.launch()
        torch.manual_seed(0)
        model = fabric.setup_module(TinyGPT(n_layer=2, d_model=64, n_head=4))
        opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.5))
        x, y = make_batch(batch=4, block_size=64, device=fabric.device)
        losses = three_steps(fabric, model, opt, x, y)
        facts = _trace_facts(model._forward_module)
        rows.append(
            {
                "name": name,
                "backend": torch.distributed.get_backend(),
                "device": str(fabric.device),
                "seconds": time.perf_counter() - t0,
                "losses": losses,
                "facts": facts,
                "problems": _problems(name, facts, losses, device_type, nvfuser),
            }
        )
    return rows


def _memory_model(device_type: str) -> tuple[Any, tuple[int, int], int]:
    """(factory, batch shape, vocabulary) of the memory check: large on CUDA (see the module docstring)."""
    import functools

    from thunderviz.demos.models import TinyGPT

    if device_type == "cuda":
        vocab, shape = 4096, (8, 512)
        return functools.partial(TinyGPT, vocab, 512, 1024, 2, 16), shape, vocab
    vocab, shape = 256, (4, 64)
    return functools.partial(TinyGPT, vocab, 64, 64, 2, 4), shape, vocab


def memory_job(rank: int, world: int, device_type: str) -> list[dict[str, Any]]:
    """Runs in a fresh rank process: plan two candidates for this device, train each, measure the step peak."""
    import torch
    from lightning.fabric import Fabric

    import thunderviz
    from thunderviz.thunder.memory.meter import StepMemoryMeter

    build, shape, vocab = _memory_model(device_type)
    y_meta = torch.empty(shape, dtype=torch.long, device="meta")

    def loss_fn(out: Any, y: Any = y_meta) -> Any:
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    plan = thunderviz.plan(
        build,
        torch.empty(shape, dtype=torch.long, device="meta"),
        loss_fn=loss_fn,
        optimizer="adamw",
        world_sizes=(world,),
        device=device_type,
        candidates=("ddp", "fsdp-zero2-block"),
    )
    rows = []
    for cand in plan.candidates:
        fabric = Fabric(accelerator="cuda" if device_type == "cuda" else "cpu", devices=world, strategy=cand.strategy())
        fabric.launch()
        torch.manual_seed(0)
        with fabric.init_module(empty_init=True):
            net = build()
        net, opt = fabric.setup(net, torch.optim.AdamW(net.parameters()))
        meter = StepMemoryMeter(lambda net=net: [net]).start()
        for step in range(4):
            g = torch.Generator().manual_seed(step)
            x = torch.randint(0, vocab, shape, generator=g).to(fabric.device)
            y = torch.randint(0, vocab, shape, generator=g).to(fabric.device)
            out = net(x)
            loss = loss_fn(out, y)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            del out, loss
        measured = meter.stop()
        peak = measured.peak_bytes
        error = None if peak is None else (cand.peak_bytes - peak) / peak
        problems = []
        if error is None or abs(error) > 0.10:
            problems.append(
                f"memory plan, {cand.name}: predicted {cand.peak_bytes} bytes, measured {peak} ({measured.source},"
                f" steps {measured.steps}{', ' + measured.note if measured.note else ''})"
            )
        rows.append(
            {
                "name": cand.name,
                "predicted": cand.peak_bytes,
                "measured": peak,
                "source": measured.source,
                "error": error,
                "problems": problems,
            }
        )
        del net, opt
        if device_type == "cuda":
            torch.cuda.empty_cache()
    return rows


#: (variant, step ratio gate, peak ratio gate) on CUDA: the bar for the decided executors; ZERO3 gathers every
#: block's weights a second time in backward (one more collective and pack/unpack per block), so its step may take
#: 1.20x eager's where DDP and ZERO2 must stay within 1.10x
SPEED_GATES = (("ours DDP", 1.10, 1.0), ("ours FSDP ZERO2 BLOCK", 1.10, 1.0), ("ours FSDP ZERO3 BLOCK", 1.20, 1.0))


def speed_job(rank: int, world: int, device_type: str) -> list[dict[str, Any]]:
    """Runs in a fresh rank process: each variant alone (built, timed, measured, freed), as in the module doc."""
    import torch
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.demos.models import TinyGPT, make_batch

    cuda = device_type == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    vocab, batch, block = (32000, 8, 1024) if cuda else (256, 4, 64)

    def build() -> Any:
        torch.manual_seed(0)
        if cuda:
            return TinyGPT(vocab_size=vocab, block_size=block, d_model=1024, n_layer=8, n_head=16).to(dtype)
        return TinyGPT(vocab_size=vocab, block_size=block, d_model=64, n_layer=2, n_head=4)

    x, y = make_batch(batch=batch, block_size=block, vocab_size=vocab, device=device)

    def plain(wrap: Any) -> tuple[Any, Any, str, Any]:
        model = build().to(device)
        return wrap(model), torch.optim.AdamW(model.parameters(), lr=1e-4), "", torch.Tensor.backward

    def ours(strategy: Any) -> tuple[Any, Any, str, Any]:
        fabric = Fabric(accelerator="cuda" if cuda else "cpu", devices=world, strategy=strategy)
        fabric.launch()
        model = fabric.setup_module(build())
        opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
        return model, opt, strategy.decisions[-2].headline, fabric.backward

    variants = {
        "eager": lambda: plain(lambda m: m),
        **({"torch.compile": lambda: plain(torch.compile)} if cuda else {}),
        "ours DDP": lambda: ours(ThunderDDPStrategy()),
        "ours FSDP ZERO2 BLOCK": lambda: ours(
            ThunderFSDPStrategy(sharding_strategy="ZERO2", bucketing_strategy="BLOCK")
        ),
        # CUDA only: the CPU rehearsal has no gates, and ZERO3's compile would add to the test suite's time for a row
        # that step 1 already runs on CPU
        **(
            {
                "ours FSDP ZERO3 BLOCK": lambda: ours(
                    ThunderFSDPStrategy(sharding_strategy="ZERO3", bucketing_strategy="BLOCK")
                )
            }
            if cuda
            else {}
        ),
    }
    rows = []
    for name, make in variants.items():
        t0 = time.perf_counter()
        model, opt, decided, backward = make()
        built = time.perf_counter() - t0
        first, step_ms, host_ms, peak = _time_steps(model, opt, backward, (x, y), cuda)
        rows.append(
            {
                "name": name,
                "first_s": built + first,
                "step_ms": step_ms,
                "host_ms": host_ms,
                "peak": peak,
                "decided": decided,
            }
        )
        del model, opt
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _time_steps(model: Any, opt: Any, backward: Any, batch: Any, cuda: bool) -> tuple[float, float, float, int | None]:
    """(seconds to the end of the first step, median ms of 10 steps after 3, the median host CPU ms of those steps
    (``time.thread_time`` around the step, before the synchronize: what the GPU waits for when host-bound), peak
    bytes of one more step on CUDA)."""
    import statistics

    import torch

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step() -> None:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        backward(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)))
        opt.step()

    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(2):
        step()
    times, host = [], []
    for _ in range(10):
        sync()
        w0, h0 = time.perf_counter(), time.thread_time()
        step()
        host.append(time.thread_time() - h0)
        sync()
        times.append(time.perf_counter() - w0)
    step_ms, host_ms = statistics.median(times) * 1e3, statistics.median(host) * 1e3
    if not cuda:
        return first, step_ms, host_ms, None
    torch.cuda.reset_peak_memory_stats()
    step()
    sync()
    return first, step_ms, host_ms, torch.cuda.max_memory_allocated()


def speed_problems(rows: list[dict[str, Any]], device_type: str) -> list[str]:
    """The gates (CUDA only): each of ``SPEED_GATES`` against eager's step time and peak."""
    if device_type != "cuda":
        return []
    by = {r["name"]: r for r in rows}
    eager = by["eager"]
    out = []
    for name, step_gate, peak_gate in SPEED_GATES:
        r = by[name]
        step_ratio, peak_ratio = r["step_ms"] / eager["step_ms"], r["peak"] / eager["peak"]
        if step_ratio > step_gate or peak_ratio > peak_gate:
            out.append(
                f"speed, {name}: {step_ratio:.2f}x eager's step time (gate {step_gate:.2f}x) and {peak_ratio:.2f}x its"
                f" peak (gate {peak_gate:.2f}x), with {r['decided']}"
            )
    return out


def _print_speed(rows: list[dict[str, Any]]) -> None:
    eager = rows[0]
    for r in rows:
        peak = "" if r["peak"] is None else f", peak {r['peak'] / 2**20:.0f} MiB ({r['peak'] / eager['peak']:.2f}x)"
        print(
            f"- {r['name']}: first step {r['first_s']:.1f} s, step {r['step_ms']:.1f} ms"
            f" ({r['step_ms'] / eager['step_ms']:.2f}x eager), host CPU {r['host_ms']:.1f} ms{peak}"
        )
        if r["decided"]:
            print(f"    {r['decided']}")


_CELL = """\
%%thunder_fsdp --nproc 1 --backend {backend} --sharding zero3 --bucketing block --name device_report
import sys
sys.path.insert(0, {bench!r})
from device_check import _problems, _trace_facts, three_steps
from thunderviz.demos.models import TinyGPT, make_batch
torch.manual_seed(0)
model = fabric.setup_module({model})
opt = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.5))
x, y = make_batch(batch=4, block_size=64, device=device)
losses = three_steps(fabric, model, opt, x, y)
facts = _trace_facts(model._forward_module)
nvfuser = thunder.extend.get_executor("nvfuser") is not None
problems = _problems("%%thunder_fsdp ZERO3 BLOCK", facts, losses, {device_type!r}, nvfuser)
print("DEVICE_CHECK", repr({{"device": str(device), "losses": losses, "facts": facts, "problems": problems}}))
"""


def _execute(kc: Any, code: str, timeout: float) -> tuple[str, str]:
    from tests.helpers.kernel import execute  # the repository root is on the path (see the end of this file)

    reply, text = execute(kc, code, timeout)
    return reply["status"], text


def kernel_check(backend: str, device_type: str, timeout: float) -> dict[str, Any]:
    """``%%thunder_fsdp --nproc 1`` in a real Jupyter kernel; returns what the rank printed and the report's summary."""
    import ast

    from jupyter_client import KernelManager

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    t0 = time.perf_counter()
    try:
        kc.wait_for_ready(timeout=60)
        status, out = _execute(kc, "%load_ext thunderviz", 60)
        if status != "ok":
            return {"problems": [f"%load_ext thunderviz failed: {out}"]}
        cell = _CELL.format(backend=backend, bench=str(ROOT / "bench"), model=_MODEL, device_type=device_type)
        status, out = _execute(kc, cell, timeout)
        if status != "ok":
            return {"problems": [f"the %%thunder_fsdp cell failed:\n{out}"]}
        line = next((ln for ln in out.splitlines() if "DEVICE_CHECK" in ln), None)
        if line is None:
            return {"problems": [f"the rank printed no DEVICE_CHECK line:\n{out}"]}
        data = ast.literal_eval(line.split("DEVICE_CHECK", 1)[1].strip())
        status, summary = _execute(
            kc, "print(repr(device_report))\nprint('BUNDLES', sorted(device_report.bundles))\n%thunder_ranks stop", 60
        )
        data["report"] = summary.strip().splitlines()[0] if summary.strip() else "(nothing printed)"
        bundles = next(
            (ln.split("BUNDLES", 1)[1].strip() for ln in summary.splitlines() if ln.startswith("BUNDLES")), ""
        )
        if status != "ok" or bundles in ("", "[]"):
            data["problems"].append(f"the RunReport carries no captured traces: {summary.strip()}")
        data["seconds"] = time.perf_counter() - t0
        return data
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _print_row(name: str, row: dict[str, Any]) -> None:
    f = row["facts"]
    execs = ", ".join(f"{k} {v}" for k, v in sorted(f["executors"].items(), key=lambda kv: -kv[1]))
    print(f"- {name} on {row['device']} ({row.get('backend', 'nccl/gloo')}), {row.get('seconds', 0):.1f} s:")
    print(f"    losses {', '.join(f'{v:.3f}' for v in row['losses'])}; trace tensors on {', '.join(f['devices'])}")
    print(f"    forward {f['forward'] or 'no collectives'}; backward {f['backward'] or 'no collectives'}")
    for trace, buckets in f["buckets"].items():
        for kind, label, n, nbytes in buckets:
            print(f"    {trace} bucket: {kind} {label} ({n} parameters, {nbytes / 1024:.1f} KiB)")
    print(f"    executors: {execs}; {f['fusions']} fusion regions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-rehearsal", action="store_true", help="run the same steps on CPU with gloo")
    parser.add_argument("--skip-strategies", action="store_true", help="leave out the strategies step")
    parser.add_argument("--skip-kernel", action="store_true", help="leave out the Jupyter kernel step")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the memory plan step")
    parser.add_argument("--skip-speed", action="store_true", help="leave out the speed and memory against eager step")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    if not args.cpu_rehearsal and not torch.cuda.is_available():
        print(
            "device_check: this check needs a CUDA GPU, but torch.cuda.is_available() is False here"
            f" (torch {torch.__version__}, built for CUDA {torch.version.cuda}). Run bench/device_check.sh on a"
            " machine with one CUDA GPU, or pass --cpu-rehearsal to run the same steps on CPU with gloo.",
            file=sys.stderr,
        )
        return 2
    import thunder

    from thunderviz.pool.spawn import run_ranks

    device_type, backend = ("cpu", "gloo") if args.cpu_rehearsal else ("cuda", "nccl")
    nvfuser = thunder.extend.get_executor("nvfuser") is not None
    gpu = torch.cuda.get_device_name(0) if device_type == "cuda" else "none (CPU rehearsal)"
    print(f"device_check: torch {torch.__version__}, thunder {thunder.__version__}, GPU {gpu}, backend {backend}")
    print(
        f"  nvFuser {'installed' if nvfuser else 'not installed'}; thunder's default executors: "
        f"{[e.name for e in thunder.get_default_executors()]}"
    )
    problems: list[str] = []
    # The two steps are independent processes (a rank; a kernel and its engine), each mostly one busy core: run them
    # at once and print them in order (on a 2-core CI machine this takes the check from ~45 s to ~30 s).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        ranks = (
            None if args.skip_strategies else pool.submit(run_ranks, strategies_job, device_type, nproc=1, timeout=200)
        )
        data = None if args.skip_kernel else kernel_check(backend, device_type, timeout=150)
        rows = [] if ranks is None else ranks.result()[0]
    if rows:
        print("1. strategies in a fresh rank process (world size 1):")
    for row in rows:
        _print_row(row["name"], row)
        problems += row["problems"]
    if data is not None:
        print(f"2. %%thunder_fsdp --nproc 1 --backend {backend} in a real Jupyter kernel:")
        if "facts" in data:
            _print_row("%%thunder_fsdp ZERO3 BLOCK", data)
            print(f"    report: {data['report']}")
        problems += data["problems"]
    if not args.skip_memory:
        print(f"3. memory plan against the measured step peak on {device_type} (world size 1):")
        for row in run_ranks(memory_job, device_type, nproc=1, timeout=200)[0]:
            err = "n/a" if row["error"] is None else f"{row['error'] * 100:+.1f}%"
            print(
                f"- {row['name']}: predicted {row['predicted'] / 2**20:.1f} MiB, measured"
                f" {(row['measured'] or 0) / 2**20:.1f} MiB ({row['source']}), {err}"
            )
            problems += row["problems"]
    if not args.skip_speed:
        what = "GPT d=1024 x 8 layers, bf16, batch 8x1024" if device_type == "cuda" else "small GPT, no gates on CPU"
        print(f"4. speed and memory against eager on {device_type} (world size 1; {what}):")
        speed = run_ranks(speed_job, device_type, nproc=1, timeout=300)[0]
        _print_speed(speed)
        problems += speed_problems(speed, device_type)
    took = time.perf_counter() - t0
    if problems:
        print(f"device_check: FAILED after {took:.0f} s:\n  " + "\n  ".join(problems))
        return 1
    print(f"device_check: all checks passed in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

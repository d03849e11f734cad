"""The seed scenarios from plain Python: each decision and the collectives it produced, no Jupyter involved.

``thunderviz demo --scenarios`` runs, on fresh rank processes with a real gloo process group, one training
step of a small GPT for every way a model reaches a thunder strategy (raw module, a module the user jitted — also
one that already ran —, a function the user jitted over the model) under FSDP and DDP; prints what the strategy
decided and why, and the collectives in rank 0's traces; checks that every rank issued the same collectives; and
writes one offline HTML report with the traces as graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from thunderviz.parallel.option_values import DEFAULT_SHARDING, Parallelism, Sharding

__all__ = ["SEED_SCENARIOS", "Scenario", "run_scenarios", "run_scenarios_on_rank", "write_report"]


@dataclass(frozen=True)
class Scenario:
    name: str
    strategy: Parallelism
    how: str  # "raw", "jitted", "jitted_ran", "function"
    sharding: Sharding = DEFAULT_SHARDING


FSDP, DDP = Parallelism.FSDP, Parallelism.DDP
SEED_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("fsdp-raw-module", FSDP, "raw"),
    Scenario("fsdp-user-jitted-module", FSDP, "jitted"),
    Scenario("fsdp-jitted-module-already-ran", FSDP, "jitted_ran"),
    Scenario("fsdp-user-jitted-function", FSDP, "function"),
    Scenario("fsdp-zero3-raw-module", FSDP, "raw", Sharding.ZERO3),
    Scenario("ddp-raw-module", DDP, "raw"),
    Scenario("ddp-user-jitted-function", DDP, "function"),
)


def run_scenarios_on_rank(rank: int, world: int, scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """Runs inside each rank: set up, one step, capture traces. Returns plain data for the parent."""
    import thunder
    import torch
    from lightning.fabric import Fabric

    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.strategies import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import bundle_to_dict

    def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    out: dict[str, Any] = {"decisions": [], "bundles": []}
    for sc in scenarios:
        jit = sc.how != "function"
        if sc.strategy is Parallelism.FSDP:
            strategy = ThunderFSDPStrategy(jit=jit, sharding_strategy=sc.sharding)
        else:
            strategy = ThunderDDPStrategy(jit=jit)
        fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
        fabric.launch()
        torch.manual_seed(0)
        model: Any = TinyGPT(n_layer=2, d_model=64, block_size=32)
        x, y = make_batch(batch=4, block_size=32, seed=rank)
        step_fn = None
        if sc.how in ("jitted", "jitted_ran"):
            model = thunder.jit(model)
            if sc.how == "jitted_ran":
                model(x)
        if sc.how == "function":
            step_fn = thunder.jit(lambda m, x, y: loss_of(m(x), y))
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
        loss = step_fn(model, x, y) if step_fn is not None else loss_of(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        traced = step_fn if step_fn is not None else strategy.thunder_modules[-1][1]
        decision = strategy.decisions[-1]
        out["decisions"].append(replace(decision, target=f"{sc.name} ({decision.target})"))
        out["bundles"].append(bundle_to_dict(capture(traced, name=sc.name, rank=rank, stages=False)))
        out.setdefault("losses", []).append(float(fabric.all_reduce(loss.detach())))
    return out


def run_scenarios(
    out_dir: Path | str = "demo-output",
    *,
    nproc: int = 2,
    scenarios: Sequence[Scenario] = SEED_SCENARIOS,
    echo: Any = print,
) -> Path:
    """Run the seed scenarios on ``nproc`` CPU ranks, print the story, write ``report.html``; return its path."""
    from thunderviz.pool.spawn import run_ranks

    echo(f"thunderviz demo: {len(scenarios)} scenarios on {nproc} CPU ranks (gloo), tiny GPT")
    per_rank = run_ranks(run_scenarios_on_rank, list(scenarios), nproc=nproc, timeout=1800)
    return write_report(per_rank, out_dir, scenarios=scenarios, echo=echo)


def write_report(
    per_rank: Sequence[dict[str, Any]],
    out_dir: Path | str,
    *,
    scenarios: Sequence[Scenario] = SEED_SCENARIOS,
    echo: Any = print,
) -> Path:
    """Print each decision and rank 0's collectives, check the ranks agree, and write the offline report."""
    from thunderviz.render.html import render_html
    from thunderviz.trace.file import bundle_from_dict, save
    from thunderviz.trace.ledger import find_mismatches, ledger_from_bundle

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nproc = len(per_rank)
    bundles = [bundle_from_dict(b) for r in per_rank for b in r["bundles"]]
    decisions = per_rank[0]["decisions"]
    problems = 0
    for i, (sc, decision) in enumerate(zip(scenarios, decisions, strict=True)):
        ledgers = {r: ledger_from_bundle(bundle_from_dict(per_rank[r]["bundles"][i])) for r in range(nproc)}
        counts = ", ".join(f"{n} {k}" for k, n in sorted(ledgers[0].counts().items())) or "none"
        mismatches = find_mismatches(ledgers)
        problems += len(mismatches)
        echo(f"\n[{sc.name}] {decision.headline}")  # the reasoning: decision.reason, and in the report
        echo(f"  rank 0 collectives: {counts}; loss {per_rank[0]['losses'][i]:.4f}")
        echo("  ranks agree" if not mismatches else "  MISMATCH: " + "; ".join(m.message for m in mismatches))
    save(bundles, out / "traces.json")
    report = out / "report.html"
    report.write_text(render_html(bundles, decisions=decisions, title="thunderviz demo"), encoding="utf-8")
    echo(f"\ntraces: {out / 'traces.json'}")
    echo(f"report: {report.resolve()}")
    if problems:
        raise RuntimeError(f"{problems} cross-rank collective mismatch(es); see the report")
    return report

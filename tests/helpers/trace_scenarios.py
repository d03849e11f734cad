"""Real 2-rank traces for the trace-model tests, produced once per pytest session.

Each rank builds a small GPT (1 block, d=32: 17 parameters), runs one forward+backward under thunder's own FSDP
and then DDP on a real gloo process group, captures both, saves them to its own file (as a cluster job would) and
returns the bundles pickled. The trace-model, ledger, diff, render and widget tests share the result through
``two_rank_run``.

``capture_what_setup_returned`` runs thunderviz's own strategies through Fabric on 2 ranks and captures whatever
``fabric.setup`` returned in each case (1: a plain module jitted by the strategy, 2: a plain module with
``jit=False`` used by the user's jitted function, 3: the user's ThunderModule), as a user would.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tests.helpers.rank_pool import run_on_pool
from tests.helpers.ranks import run_ranks
from tests.helpers.run_once import once_per_run

MODEL_KW = {"vocab_size": 64, "block_size": 16, "d_model": 32, "n_layer": 1, "n_head": 2}


@dataclass
class RankResult:
    rank: int
    fsdp: object
    ddp: object
    param_names: list[str]
    param_shapes: dict[str, tuple[int, ...]]
    path: str


def capture_fsdp_and_ddp(rank: int, world_size: int, out_dir: str) -> RankResult:
    import thunder
    import torch
    import torch.distributed as dist

    from thunderviz.demos.models import TinyGPT, make_batch
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import save

    if not dist.is_initialized():  # on the session's rank pair an earlier job may have created it
        dist.init_process_group("gloo")
    x, y = make_batch(batch=2, block_size=MODEL_KW["block_size"], vocab_size=MODEL_KW["vocab_size"])
    bundles = {}
    for kind in ("fsdp", "ddp"):
        torch.manual_seed(0)
        model = TinyGPT(**MODEL_KW)
        jm = thunder.jit(model)
        jm = thunder.distributed.fsdp(jm, device=torch.device("cpu")) if kind == "fsdp" else thunder.distributed.ddp(jm)
        logits = jm(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        bundles[kind] = capture(jm, f"gpt-{kind}")
    path = str(Path(out_dir) / f"traces-rank{rank}.json")
    save([bundles["fsdp"], bundles["ddp"]], path)
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: tuple(p.shape) for n, p in TinyGPT(**MODEL_KW).named_parameters()}
    return RankResult(rank, bundles["fsdp"], bundles["ddp"], names, shapes, path)


@once_per_run
def two_rank_run() -> list[RankResult]:
    out_dir = tempfile.mkdtemp(prefix="thunderviz-traces-")
    return run_on_pool(capture_fsdp_and_ddp, out_dir, timeout=240)


class _Net(nn.Module):
    """Two layers; first dims 7 and 3, so FSDP pads one shard and the shapes differ from every other test model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return (out.float() ** 2).mean()


def capture_what_setup_returned(rank: int, world_size: int, kinds: tuple[str, ...]) -> dict:
    """Per strategy kind and case, capture ``fabric.setup``'s return value and the jitted object directly."""
    return {kind: _capture_cases(rank, world_size, kind) for kind in kinds}


def _capture_cases(rank: int, world_size: int, kind: str) -> dict:
    import thunder
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.errors import TraceCaptureError
    from thunderviz.thunder.capture.traces import capture

    def summary(bundle) -> dict:
        ops = bundle.forward.ops + (bundle.backward.ops if bundle.backward else [])
        return {
            "name": bundle.name,
            "fwd": [op.op for op in bundle.forward.ops],
            "bwd": [op.op for op in bundle.backward.ops] if bundle.backward else None,
            "collectives": sorted({op.collective for op in ops if op.collective}),
            "params": sorted(bundle.forward.param_names.values()),
            "rank": bundle.rank,
            "world": bundle.world_size,
        }

    out: dict = {}
    cls = ThunderFSDPStrategy if kind == "fsdp" else ThunderDDPStrategy
    for case in ("1", "2", "3"):
        strategy = cls(jit=case != "2")
        fabric = Fabric(accelerator="cpu", devices=world_size, strategy=strategy)
        fabric.launch()
        torch.manual_seed(0)
        module = _Net()
        if case == "3":
            module = thunder.jit(module)
        model = fabric.setup(module)
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(rank))
        step = thunder.jit(lambda m, x: _loss(m(x))) if case == "2" else None
        loss = step(model, x) if step is not None else _loss(model(x))
        fabric.backward(loss)
        direct = step if step is not None else model._forward_module
        out[case] = {
            "setup": summary(capture(model)),
            "direct": summary(capture(direct, name="direct")),
            "inner": summary(capture(model.module)) if case == "2" else None,
        }
        if case == "2":
            # A second jitted function used with the same model: capture(model) cannot choose, and says what to pass.
            other = thunder.jit(lambda m, x: _loss(m(x)) * 2)
            fabric.backward(other(model, x))
            try:
                capture(model)
                out["ambiguous"] = None
            except TraceCaptureError as e:
                out["ambiguous"] = str(e)
            del other
    return out


@once_per_run
def setup_captures() -> list[dict]:
    """``capture_what_setup_returned`` for FSDP and DDP on 2 real gloo ranks, once per test run (shared by the
    xdist workers)."""
    return run_on_pool(capture_what_setup_returned, ("fsdp", "ddp"), timeout=500)


#: Small real trace files (FSDP with every stage, and DDP, of ``_Net`` on 2 ranks) kept in the repository: the
#: property test of the file format mutates them, and loading them checks that files written earlier still open.
SMALL_TRACE_FILES = [Path(__file__).resolve().parents[1] / "trace" / "data" / f"small-rank{r}.json" for r in range(2)]


def capture_small(rank: int, world_size: int, out_dir: str) -> str:
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.thunder.capture.traces import capture
    from thunderviz.trace.file import save

    bundles = []
    for kind, cls in (("fsdp", ThunderFSDPStrategy), ("ddp", ThunderDDPStrategy)):
        fabric = Fabric(accelerator="cpu", devices=world_size, strategy=cls())
        fabric.launch()
        torch.manual_seed(0)
        model = fabric.setup(_Net())
        fabric.backward(_loss(model(torch.randn(4, 5, generator=torch.Generator().manual_seed(rank)))))
        bundles.append(capture(model, f"net-{kind}", stages=kind == "fsdp"))
    return str(save(bundles, Path(out_dir) / f"small-rank{rank}.json"))


if __name__ == "__main__":
    # python -m tests.helpers.trace_scenarios: rewrite SMALL_TRACE_FILES (after a change to the file format).
    print(run_ranks(capture_small, str(SMALL_TRACE_FILES[0].parent), nproc=2, timeout=300))

"""Real 2-rank traces for the trace-model tests, produced once per pytest session.

Each rank builds a small GPT (1 block, d=32: 17 parameters), runs one forward+backward under thunder's own FSDP
and then DDP on a real gloo process group, captures both, saves them to its own file (as a cluster job would) and
returns the bundles pickled. Tests in tests/unit and tests/distributed share the result through ``two_rank_run``.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.ranks import run_ranks

MODEL_KW = dict(vocab_size=64, block_size=16, d_model=32, n_layer=1, n_head=2)


@dataclass
class RankResult:
    rank: int
    fsdp: object
    ddp: object
    param_names: list[str]
    param_shapes: dict[str, tuple[int, ...]]
    path: str


def capture_fsdp_and_ddp(rank: int, world_size: int, out_dir: str) -> RankResult:
    import torch
    import torch.distributed as dist
    import thunder

    from thunderviz.core.traces import capture, save
    from thunderviz.models import TinyGPT, make_batch

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


@functools.lru_cache(maxsize=1)
def two_rank_run() -> list[RankResult]:
    out_dir = tempfile.mkdtemp(prefix="thunderviz-traces-")
    return run_ranks(capture_fsdp_and_ddp, out_dir, nproc=2, timeout=240)

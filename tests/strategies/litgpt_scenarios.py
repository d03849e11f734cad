"""A real model in litgpt's pretraining order of calls, on rank processes and on one process for reference.

litgpt's ``pretrain.py`` (0.5.x) does: ``fabric.seed_everything``; ``with fabric.init_module(empty_init=True):
GPT(config)``; ``initialize_weights`` (overrides each Linear/Embedding's ``reset_parameters``; calls them at once
unless the strategy is Lightning's FSDP); ``fabric.setup(model)``; an AdamW optimizer with
``fabric.setup_optimizers``; then per micro-batch ``with fabric.no_backward_sync(model, enabled=is_accumulating)``
forward + ``fabric.backward(loss / accumulation)``, and on the last micro-batch ``fabric.clip_gradients(model,
optimizer, max_norm=...)``, ``optimizer.step()``, ``optimizer.zero_grad()``; ``fabric.save(path, state)`` and
``fabric.load(path, state)`` to resume. Random init, no weights; a tiny config so it runs in seconds. FSDP gets
litgpt's own default executors (``extensions/thunder/pretrain.py``: sdpa, torchcompile, nvfuser, torch): nvFuser is
left out where it is not installed (a recorded decision and a warning) and torchcompile fuses around our
collectives, so that run is litgpt's default configuration end to end. DDP keeps our decided executors (thunder's
defaults on CPU): torchcompile's compile costs this test about 20 s per strategy, and DDP with torchcompile is
trained against one process in test_fusion_executors_2rank.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from tests.strategies.common import full_params

CONFIG = {
    "block_size": 16,
    "vocab_size": 64,
    "padded_vocab_size": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 32,
    "n_query_groups": 2,
    "rotary_percentage": 1.0,
    "parallel_residual": False,
    "bias": False,
    "norm_class_name": "RMSNorm",
    "mlp_class_name": "LLaMAMLP",
    "intermediate_size": 48,
}
SEED = 42
ACCUMULATION = 2  # micro-batches per optimizer step
MICRO_BATCH = 2
STEPS = 4  # optimizer steps; the checkpoint is taken after SAVE_AT
SAVE_AT = 2
MAX_NORM = 0.3
LITGPT_EXECUTORS = ("sdpa", "torchcompile", "nvfuser", "torch")
LR = 3e-3


def micro_batch(iter_num: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(
        0,
        CONFIG["vocab_size"],
        (MICRO_BATCH, CONFIG["block_size"] + 1),
        generator=torch.Generator().manual_seed(1000 * iter_num + rank),
    )
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def _build(fabric: Any) -> Any:
    """litgpt's order: init_module(empty_init=True), GPT(config), initialize_weights."""
    from litgpt import GPT, Config
    from litgpt.pretrain import initialize_weights

    config = Config(**CONFIG)
    with fabric.init_module(empty_init=True) if hasattr(fabric, "init_module") else torch.device("meta"):
        model = GPT(config)
    initialize_weights(fabric, model, n_layer=config.n_layer, n_embd=config.n_embd)
    return model


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1, betas=(0.9, 0.95))


def _fit(fabric: Any, state: dict[str, Any], until: int, log: dict[str, list]) -> None:
    from litgpt.utils import chunked_cross_entropy

    model, optimizer = state["model"], state["optimizer"]
    while state["step_count"] < until:
        state["iter_num"] += 1
        x, y = micro_batch(state["iter_num"], fabric.global_rank)
        is_accumulating = state["iter_num"] % ACCUMULATION != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            logits = model(x)
            loss = chunked_cross_entropy(logits, y)
            fabric.backward(loss / ACCUMULATION)
        log["losses"].append(float(fabric.all_reduce(loss.detach(), reduce_op="mean")))
        if not is_accumulating:
            log["norms"].append(float(fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM)))
            optimizer.step()
            optimizer.zero_grad()
            state["step_count"] += 1


def reference(world: int) -> dict[str, Any]:
    """One process, eager: the same meta build and resets, the whole global batch, torch's own clipping."""
    from litgpt.utils import chunked_cross_entropy

    from thunderviz.strategies.materialize import materialize_

    torch.manual_seed(SEED)
    model = _build(SimpleNamespace(strategy=None))
    materialize_(model, torch.device("cpu"))
    optimizer = _optimizer(model.parameters())
    log: dict[str, list] = {"losses": [], "norms": []}
    for iter_num in range(1, STEPS * ACCUMULATION + 1):
        per_rank = [chunked_cross_entropy(model(x), y) for x, y in (micro_batch(iter_num, r) for r in range(world))]
        loss = sum(per_rank) / world
        (loss / ACCUMULATION).backward()
        log["losses"].append(float(loss))
        if iter_num % ACCUMULATION == 0:
            log["norms"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
            optimizer.step()
            optimizer.zero_grad()
    return {**log, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def pretrain(rank: int, world: int, kind: str, path: str) -> dict[str, Any]:
    """Train STEPS steps, saving after SAVE_AT; then resume from the checkpoint in fresh objects and finish."""
    from lightning.fabric import Fabric

    from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
    from thunderviz.thunder.jit import direct_regions
    from thunderviz.thunder.reuse import compile_reuse

    strategy = (
        ThunderFSDPStrategy(executors=list(LITGPT_EXECUTORS))
        if kind == "fsdp"
        else ThunderDDPStrategy(state_dict_type="sharded")
    )
    fabric = Fabric(accelerator="cpu", devices=world, strategy=strategy)
    fabric.launch()

    def start() -> dict[str, Any]:
        fabric.seed_everything(SEED)
        model = _build(fabric)
        on_meta = all(p.is_meta for p in model.parameters())
        model = fabric.setup(model)
        optimizer = fabric.setup_optimizers(_optimizer(model.parameters()))
        return {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0, "_on_meta": on_meta}

    state = start()
    on_meta = state.pop("_on_meta")
    log: dict[str, list] = {"losses": [], "norms": []}
    _fit(fabric, state, SAVE_AT, log)
    fabric.save(path, state)
    _fit(fabric, state, STEPS, log)
    uninterrupted = full_params(state["model"])

    compile_reuse.take_events()
    resumed = start()
    resumed.pop("_on_meta")
    fabric.load(path, resumed)
    resumed_log: dict[str, list] = {"losses": [], "norms": []}
    _fit(fabric, resumed, STEPS, resumed_log)
    resumed_compiles = compile_reuse.take_events()
    return {
        "on_meta_before_setup": on_meta,
        "log": log,
        "uninterrupted": uninterrupted,
        "resumed": full_params(resumed["model"]),
        "resumed_log": resumed_log,
        "resumed_counters": (resumed["iter_num"], resumed["step_count"]),
        "resumed_compiles": resumed_compiles,
        "decision": strategy.decisions[-1].to_dict(),
        "executors": strategy.decisions[-2].to_dict(),
        "direct_regions": direct_regions.counts(),
        "reference": reference(world) if rank == 0 else None,
    }


def both(rank: int, world: int, tmp: str) -> dict[str, Any]:
    return {kind: pretrain(rank, world, kind, f"{tmp}/{kind}") for kind in ("fsdp", "ddp")}

"""Hugging Face transformers models (random init from tiny configs, no downloads, transformers' defaults, so
``use_cache=True``) under both strategies on rank processes, against one eager process on the global batch.

Which model meets which front door, pairwise rather than the full product (each case and each strategy with an HF
model; every set-up of an HF model costs a first interpretation per rank, ~15 CPU-s, so there is one per model):
``thunderviz.plan`` on the Llama, then ``ThunderAutoStrategy`` choosing from it FSDP ZERO3 with every decoder layer
checkpointed and running case 1 as a whole training loop (AdamW, clipping, a sharded checkpoint saved, loaded and
continued); Qwen2 case 2 under FSDP ZERO3 (``jit=False`` and the user's ``thunder.jit`` of a loss function); Phi3
case 3 under DDP and GPT-2 case 3 under FSDP ZERO2 (modules the user jitted before ``fabric.setup``).

One model config per family, built the same way everywhere, so a set-up of an equal model reuses the interpreted
trace (the resumed loop: ``thunder.reuse``).
"""

from __future__ import annotations

from typing import Any

import torch

STEPS = 3
SAVE_AT = 2  # the loop saves after this many steps, then a fresh model resumes from it
LR = 0.05
ADAMW_LR = 0.01
MAX_NORM = 0.5
VOCAB = 48


def built(name: str = "llama", seed: int = 0) -> Any:
    """A tiny ``name`` model (hidden 24, 2 decoder layers: the fewest that make FSDP's block buckets; Phi3, under
    DDP, has one, each layer being a part of its interpretation) with transformers' defaults otherwise.

    Phi3's default ``pad_token_id`` (32000) lies outside a small vocabulary, and GPT-2's dropouts (0.1) would make no
    run equal to another: both are set, nothing else.
    """
    import transformers as tf

    small = {"vocab_size": VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 16}
    heads = {"hidden_size": 24, "intermediate_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2}
    configs = {
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**small, **heads)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, **heads)),
        "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**{**small, "num_hidden_layers": 1}, **heads, pad_token_id=0)),
        "gpt2": lambda: tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=VOCAB,
                n_embd=24,
                n_layer=2,
                n_head=4,
                n_positions=16,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        ),
    }
    torch.manual_seed(seed)
    return configs[name]()


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(100 * step + rank))


def loss_of(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The training step's loss, as a user jits it in case 2 (``thunder.jit(loss_of)``)."""
    return model(x, labels=x).loss


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=ADAMW_LR, weight_decay=0.1)


def reference(name: str, world: int, optimizer: str = "sgd", steps: int = STEPS) -> dict[str, list[float]]:
    """One eager process on the global batch: each step's loss (the mean over the ranks' batches) and, with AdamW,
    the gradient norm torch's clipping saw."""
    model = built(name)
    opt = _adamw(model.parameters()) if optimizer == "adamw" else torch.optim.SGD(model.parameters(), lr=LR)
    out: dict[str, list[float]] = {"losses": [], "norms": []}
    for step in range(steps):
        loss = sum(model(batch(step, r), labels=batch(step, r), use_cache=False).loss for r in range(world)) / world
        opt.zero_grad()
        loss.backward()
        if optimizer == "adamw":
            out["norms"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        out["losses"].append(float(loss))
    return out


def _facts(launched: Any, model: Any, use_cache_before: bool) -> dict[str, Any]:
    return {
        "use_cache": (use_cache_before, model.config.use_cache),
        "decision": launched.strategy.decisions[-1].to_dict(),
    }


def _buckets(jitted: Any) -> list[str]:
    """The labels of the forward's FSDP buckets, in order."""
    from thunderviz.thunder import compile_state

    return [b.label for b in compile_state.comm_buckets(jitted).get("forward", [])]


def _sgd_steps(launched: Any, wrapped: Any, rank: int, step_fn: Any = None) -> list[float]:
    opt = launched.setup_optimizers(torch.optim.SGD(wrapped.parameters(), lr=LR))
    losses = []
    for step in range(STEPS):
        x = batch(step, rank)
        loss = step_fn(wrapped, x) if step_fn is not None else wrapped(x, labels=x).loss
        opt.zero_grad()
        launched.backward(loss)
        opt.step()
        losses.append(float(launched.all_reduce(loss.detach(), reduce_op="mean")))
    return losses


def _logits_loss(out: Any) -> torch.Tensor:
    return out.logits.float().pow(2).mean()


#: the plan's candidates: one trace each (ZERO3, and ZERO3 with every decoder layer checkpointed)
PLANNED = ("fsdp-zero3-block", "fsdp-zero3-block+ac")


def _planned(model: Any, rank: int, world: int) -> Any:
    """``thunderviz.plan`` on rank 0, broadcast (it is one process's prediction) over the rank pair's process group,
    which the suite's earlier set-ups launched."""
    import thunderviz

    holder: list[Any] = [None]
    if rank == 0:
        holder[0] = thunderviz.plan(
            model, batch(0, 0), loss_fn=_logits_loss, device="cpu", world_sizes=(world,), candidates=PLANNED
        )
    torch.distributed.broadcast_object_list(holder, src=0)
    return holder[0]


def _plan_facts(plan: Any) -> dict[str, Any]:
    return {
        c.name: {
            "peak": c.peak_bytes,
            "fits": c.fits,
            "checkpointed": [k.__name__ for k in c.options.activation_checkpointing_policy.classes]
            if c.options.activation_checkpointing_policy
            else [],
        }
        for c in plan.candidates
    }


def llama_loop(rank: int, world: int, path: str) -> dict[str, Any]:
    """``thunderviz.plan`` on the Llama, then ``ThunderAutoStrategy`` with the checkpointed candidate's predicted
    peak as its budget, which only that candidate fits: it chooses FSDP ZERO3 with every decoder layer checkpointed
    and runs case 1 as a whole training loop: AdamW (what the plan assumes), ``fabric.clip_gradients``,
    ``fabric.save`` after SAVE_AT steps (a sharded checkpoint: torch.distributed.checkpoint), then a fresh model
    (other weights) set up, ``fabric.load`` and the remaining steps. One set-up serves the plan, the auto strategy
    and the checkpointed loop: they do not interfere, and each set-up of an HF model costs a first interpretation."""
    import thunderviz
    from tests.strategies.common import fabric_with, full_params
    from thunderviz.thunder.reuse import compile_reuse

    plan = _planned(built("llama"), rank, world)
    strategy = thunderviz.ThunderAutoStrategy(plan.candidate("fsdp-zero3-block+ac").peak_bytes, plan=plan)
    launched = fabric_with(strategy, world)

    def start(seed: int) -> dict[str, Any]:
        model = built("llama", seed)
        wrapped = launched.setup(model)
        return {"model": wrapped, "optimizer": launched.setup_optimizers(_adamw(wrapped.parameters())), "step": 0}

    def fit(state: dict[str, Any], until: int, log: dict[str, list[float]]) -> None:
        model, opt = state["model"], state["optimizer"]
        while state["step"] < until:
            x = batch(state["step"], rank)
            loss = model(x, labels=x).loss
            launched.backward(loss)
            log["norms"].append(float(launched.clip_gradients(model, opt, max_norm=MAX_NORM)))
            opt.step()
            opt.zero_grad()
            log["losses"].append(float(launched.all_reduce(loss.detach(), reduce_op="mean")))
            state["step"] += 1

    state = start(seed=0)
    use_cache = (True, state["model"].module.config.use_cache)
    log: dict[str, list[float]] = {"losses": [], "norms": []}
    fit(state, SAVE_AT, log)
    launched.save(path, state)
    fit(state, STEPS, log)
    facts = {
        "use_cache": use_cache,
        "decision": strategy.decisions[-1].to_dict(),
        "chosen": strategy.chosen.name,
        "buckets": _buckets(state["model"]._forward_module),
    }
    uninterrupted = full_params(state["model"])

    compile_reuse.take_events()
    resumed = start(seed=99)
    launched.load(path, resumed)
    resumed_log: dict[str, list[float]] = {"losses": [], "norms": []}
    fit(resumed, STEPS, resumed_log)
    compiles = compile_reuse.take_events()
    return {
        **facts,
        "plan": _plan_facts(plan),
        "table": plan.table(),
        "log": log,
        "resumed_log": resumed_log,
        "resumed_step": resumed["step"],
        "uninterrupted": uninterrupted,
        "resumed": full_params(resumed["model"]),
        "resumed_compiles": compiles,
        "reference": reference("llama", world, "adamw") if rank == 0 else None,
    }


def qwen2_function(rank: int, world: int) -> dict[str, Any]:
    """Case 2 under FSDP ZERO3: ``jit=False``, the user's ``thunder.jit(loss_of)`` called with the set-up model."""
    import thunder

    from tests.strategies.common import fabric

    launched = fabric("fsdp", jit=False, sharding_strategy="ZERO3")
    model = built("qwen2")
    before = model.config.use_cache
    wrapped = launched.setup(model)
    step = thunder.jit(loss_of)
    losses = _sgd_steps(launched, wrapped, rank, step)
    return {
        "losses": losses,
        **_facts(launched, model, before),
        "buckets": _buckets(step),
        "reference": reference("qwen2", world)["losses"] if rank == 0 else None,
    }


def user_jitted(rank: int, world: int, name: str, kind: str, sharding: str | None) -> dict[str, Any]:
    """Case 3: the user's ``thunder.jit(model)`` handed to ``fabric.setup``."""
    import thunder

    from tests.strategies.common import fabric

    launched = fabric(kind, **({"sharding_strategy": sharding} if sharding else {}))
    model = built(name)
    before = model.config.use_cache
    wrapped = launched.setup(thunder.jit(model))
    losses = _sgd_steps(launched, wrapped, rank)
    return {
        "losses": losses,
        **_facts(launched, model, before),
        "buckets": _buckets(wrapped._forward_module),
        "reference": reference(name, world)["losses"] if rank == 0 else None,
    }


def suite(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """Every HF scenario in one job on the session's rank pair."""
    return {
        "qwen2 function": qwen2_function(rank, world),
        "phi3 jitted": user_jitted(rank, world, "phi3", "ddp", None),
        "gpt2 jitted": user_jitted(rank, world, "gpt2", "fsdp", "ZERO2"),
        "llama loop": llama_loop(rank, world, f"{tmp}/llama"),  # last: its plan is broadcast over the launched group
    }

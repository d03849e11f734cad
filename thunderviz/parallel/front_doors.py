"""How an object reached ``fabric.setup`` beyond a plain module or ``thunder.jit``, as plain data, and what each such
front door allows (read by ``parallel.decisions.decide``).

The front doors users arrive by: thunder's README entry point ``thunder.compile(model, recipe=..., plugins=...)``
(a recipe picks executors and transforms; a plugin adds distribution, CUDA graphs, FP8 or int4 quantization), thunder's
Dynamo front end (``thunder.dynamo.thunderfx(model)``, ``torch.compile(model, backend=ThunderCompiler())``), and
Hugging Face transformers models. ``thunder.jit.facts`` reads these facts from the live object; nothing here imports
thunder, torch or transformers, so every row is a unit test.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from thunderviz.parallel.option_values import TextEnum

__all__ = [
    "PLUGIN_RULES",
    "TRANSFORMERS_RANGE",
    "FrontDoor",
    "PluginRule",
    "Preparation",
    "TransformersFacts",
    "transformers_in_range",
]

#: The transformers versions whose models thunderviz traces with thunder 0.2.6: the 4.55 series, tested at 4.55.4 (the
#: top of thunder's own HF recipe; the ``hf`` extra and constraints.txt install it). Since 4.51 transformers builds
#: attention masks with ``torch.vmap``, which thunder's interpreter cannot trace; ``thunder.jit.hf`` builds them by
#: broadcasting instead.
TRANSFORMERS_RANGE = ("4.55.0", "4.55.4")


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"4.55.4"`` -> ``(4, 55, 4)``; a suffix (``.dev0``, ``rc1``) ends the numeric part."""
    out: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(out)


def transformers_in_range(version: str) -> bool:
    """True when ``version`` lies in ``TRANSFORMERS_RANGE`` (inclusive)."""
    low, high = (_version_tuple(v) for v in TRANSFORMERS_RANGE)
    return low <= _version_tuple(version) <= high


@dataclass(frozen=True)
class FrontDoor:
    """How the user compiled the object they handed over, when it was not a plain module or ``thunder.jit``."""

    #: the call in the user's words: ``thunder.compile(model, recipe=BaseRecipe(fuser='torch.compile'))``,
    #: ``thunderfx(model)``, ``torch.compile(model, backend=ThunderCompiler())``; "" for a plain module / thunder.jit
    call: str = ""
    #: the thunder recipe class (``BaseRecipe``, ``HFTransformers``) when ``thunder.compile`` made the module
    recipe: str = ""
    #: thunder plugins applied by ``thunder.compile(..., plugins=...)``, by their registry names (``fsdp``, ``fp8``)
    plugins: tuple[str, ...] = ()
    #: Dynamo: the ``torch.compile`` backend (``ThunderCompiler`` for thunder's own, else its name); "" without Dynamo
    dynamo_backend: str = ""
    #: ``ThunderCompiler``'s thunder.jit options beyond its own defaults (names only)
    dynamo_options: tuple[str, ...] = ()
    #: Fabric unwrapped a ``torch.compile``d module and will compile what the strategy returns again
    fabric_recompiles: bool = False


@dataclass(frozen=True)
class TransformersFacts:
    """A Hugging Face ``transformers`` model: what tracing it with thunder depends on."""

    version: str
    model_class: str
    #: ``config.use_cache``: the forward builds a ``DynamicCache``, which thunder's interpreter cannot hold
    use_cache: bool = False
    #: the installed transformers builds attention masks with ``torch.vmap`` (``masking_utils._vmap_for_bhqkv``)
    masks_by_vmap: bool = False
    #: ``config._attn_implementation`` (``sdpa``, ``eager``)
    attention: str = ""


class Preparation(TextEnum):
    """A trace-time registration or setting the decision asks for before thunder traces a model."""

    #: ``transformers.masking_utils._vmap_for_bhqkv`` is traced as the same mask built by broadcasting
    MASKS_BY_BROADCASTING = "attention masks built by broadcasting"
    #: ``model.config.use_cache = False``: a training forward has no use for the generation cache
    NO_GENERATION_CACHE = "use_cache turned off"
    #: case 2: Fabric's hook walk over the output (which deep-copies a ``ModelOutput``) traced tensor by tensor
    OUTPUT_HOOKS_BY_LEAVES = "Fabric's output hooks traced tensor by tensor"


class PluginUse(str, enum.Enum):
    KEEP = "keep"
    REFUSE = "refuse"


@dataclass(frozen=True)
class PluginRule:
    """What a thunder plugin found on a module does to our distribution: kept beside it, or refused with the why."""

    use: PluginUse
    #: thunder's class, as the user spelled it (``thunder.plugins.FSDP``)
    spelled: str
    why: str


PLUGIN_RULES: dict[str, PluginRule] = {
    "fsdp": PluginRule(
        PluginUse.REFUSE,
        "thunder.plugins.FSDP",
        "it already sharded the module when thunder.compile ran (its FSDPTransform released the original parameters"
        " to the meta device and keeps the shards in the compiled module), and it has none of the strategy's"
        " communication plan, checkpoints, clipping, no_backward_sync or reports",
    ),
    "ddp": PluginRule(
        PluginUse.REFUSE,
        "thunder.plugins.DDP",
        "it already made the module data parallel when thunder.compile ran (its DDPTransform all-reduces the"
        " gradients in its own buckets), so every gradient would be reduced twice",
    ),
    "reduce-overhead": PluginRule(
        PluginUse.REFUSE,
        "thunder.plugins.ReduceOverhead",
        "its CUDAGraphTransform captures every op of the trace except unpacking, returns and .item() into CUDA"
        " graphs, the collectives the strategy adds and schedules included, so the buckets would be replayed"
        " from a graph outside the communication plan (CUDA only; thunder 0.2.6 does not keep collectives out)",
    ),
    "quantize-int4": PluginRule(
        PluginUse.REFUSE,
        "thunder.plugins.QuantizeInt4",
        "it replaced the Linear weights by bitsandbytes' packed 4-bit tensors, which are frozen (no gradient to"
        " reduce) and cannot be sharded along their first dimension (CUDA only)",
    ),
    "fp8": PluginRule(
        PluginUse.KEEP,
        "thunder.plugins.FP8",
        "it adds Transformer Engine's executor, which claims Linear layers only: the collectives stay with the"
        " torch executor, outside its kernels, so the strategy distributes the module as for any executor (CUDA"
        " with transformer_engine installed)",
    ),
}

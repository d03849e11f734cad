"""Reading a front door from a live object: what ``thunder.compile``'s recipe and plugins left on a ThunderModule,
what Dynamo wrapped (``thunderfx``, ``torch.compile``), and what a transformers model's tracing depends on.

thunder records no recipe or plugin on the module ``thunder.compile`` returns; what it does record is the module's
transforms (``thunder.list_transforms``) and executors (its compile data), and each recipe and plugin of thunder
0.2.6 leaves its own there, so they are recognised by those (class names, so reading them imports nothing).
"""

from __future__ import annotations

import sys
from typing import Any

from thunderviz.parallel.front_doors import FrontDoor, TransformersFacts

__all__ = ["dynamo_door", "dynamo_inner", "thunder_module_door", "transformers_facts"]

#: thunder transform class -> the plugin that adds it (``thunder/plugins/``)
_PLUGIN_TRANSFORMS = {
    "CUDAGraphTransform": "reduce-overhead",
    "BitsAndBytesLinearQuant4bit": "quantize-int4",
}
#: what ThunderCompiler sets itself (``thunder/dynamo/compiler.py``): not the user's options
_THUNDERFX_DEFAULTS = frozenset({"fusion_type", "thunderfx_disable_split_autograd"})


def thunder_module_door(jitted: Any) -> tuple[FrontDoor, str | None]:
    """The recipe and plugins ``thunder.compile`` left on a ThunderModule, and which distribution thunder applied
    (``'fsdp'``/``'ddp'``, by its plugin or ``thunder.distributed``; None when none)."""
    import thunder

    cd = thunder.compile_data(jitted)
    transforms = [type(t).__name__ for t in getattr(jitted, "_lc_transforms", None) or ()]
    executors = [str(ex.name) for ex in getattr(cd, "executors_list", ()) or ()]
    distributed = "fsdp" if getattr(cd, "use_fsdp", False) else "ddp" if getattr(cd, "use_ddp", False) else None
    recipe = ""
    if "InplaceIndexCopyTransform" in transforms:
        recipe = "HFTransformers"
    elif "PrunePrologueChecks" in transforms:
        recipe = "BaseRecipe"
    if not recipe:
        # thunder.jit(model, transforms=...) or thunder.distributed.fsdp/ddp: not thunder.compile
        return FrontDoor(), distributed
    plugins = [p for t, p in _PLUGIN_TRANSFORMS.items() if t in transforms]
    if any("transformer_engine" in e for e in executors):
        plugins.append("fp8")
    if distributed:
        plugins.insert(0, distributed)
    fuser = "torch.compile" if "torchcompile" in executors else "nvfuser" if "nvfuser" in executors else ""
    spelled = f"{recipe}(fuser={fuser!r})" if recipe == "BaseRecipe" and fuser else f"{recipe}()"
    listed = f", plugins=[{', '.join(repr(p) for p in plugins)}]" if plugins else ""
    call = f"thunder.compile(model, recipe={spelled}{listed})"
    return FrontDoor(call=call, recipe=recipe, plugins=tuple(plugins)), distributed


def dynamo_inner(obj: Any) -> Any:
    """The module inside ``thunderfx(model)`` or ``torch.compile(model)`` (None for anything else)."""
    if type(obj).__name__ == "ThunderFXCompiledObject":
        obj = getattr(obj, "_func", None)
    if type(obj).__name__ == "OptimizedModule":
        return getattr(obj, "_orig_mod", None)
    return None


def _backend_door(backend: Any, call: str, **kw: Any) -> FrontDoor:
    if type(backend).__name__ == "ThunderCompiler":
        options = tuple(sorted(set(getattr(backend, "thunder_options", {})) - _THUNDERFX_DEFAULTS))
        return FrontDoor(call=call, dynamo_backend="ThunderCompiler", dynamo_options=options, **kw)
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    return FrontDoor(call=call, dynamo_backend=str(name), **kw)


def dynamo_door(obj: Any, fabric_compile_kwargs: dict[str, Any] | None = None) -> FrontDoor | None:
    """The Dynamo front door of ``obj`` (``thunderfx``'s object or a ``torch.compile``d module), or of the plain module
    Fabric unwrapped from one (``fabric_compile_kwargs``: the ``torch.compile`` keywords Fabric will apply again)."""
    if type(obj).__name__ == "ThunderFXCompiledObject":
        return _backend_door(getattr(obj, "_backend", None), "thunderfx(model)")
    kwargs = fabric_compile_kwargs
    if kwargs is None and type(obj).__name__ == "OptimizedModule":
        kwargs = getattr(obj, "_compile_kwargs", None) or {}
    if kwargs is None:
        return None
    backend = kwargs.get("backend", "inductor")
    if type(backend).__name__ == "ThunderCompiler":
        call = "torch.compile(model, backend=ThunderCompiler())"
    elif backend == "inductor":
        call = "torch.compile(model)"
    else:
        call = f"torch.compile(model, backend={backend!r})"
    return _backend_door(backend, call, fabric_recompiles=fabric_compile_kwargs is not None)


def transformers_facts(module: Any) -> TransformersFacts | None:
    """What tracing a Hugging Face model depends on; None for any other module (transformers is never imported here:
    a model of it exists only once the user imported it)."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(module, transformers.PreTrainedModel):
        return None
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        try:
            import transformers.masking_utils as masking
        except ImportError:  # transformers < 4.53 builds masks elsewhere, without torch.vmap
            masking = None
    config = module.config
    return TransformersFacts(
        version=str(transformers.__version__),
        model_class=type(module).__name__,
        use_cache=bool(getattr(config, "use_cache", False)),
        masks_by_vmap=hasattr(masking, "_vmap_for_bhqkv"),
        attention=str(getattr(config, "_attn_implementation", "") or ""),
    )

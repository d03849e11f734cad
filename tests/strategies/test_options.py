"""Strategy construction and registration, without processes."""

from __future__ import annotations

import warnings

import pytest
from lightning.fabric.strategies import STRATEGY_REGISTRY
from thunder.distributed import FSDPBucketingStrategy, FSDPType
from torch.distributed.fsdp import ShardingStrategy

import thunderviz
from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
from thunderviz.parallel.option_values import OptionError, Parallelism, UnknownOptionError
from thunderviz.parallel.options import FOREIGN_OPTIONS, OPTIONS


def test_exact_names_registered_with_fabric():
    names = {n for n in STRATEGY_REGISTRY.available_strategies() if n.startswith("thunder")}
    assert names == {"thunder_fsdp", "thunder_fsdp_zero3", "thunder_ddp", "thunder_auto"}
    assert type(STRATEGY_REGISTRY.get("thunder_fsdp")) is ThunderFSDPStrategy
    assert type(STRATEGY_REGISTRY.get("thunder_ddp")) is ThunderDDPStrategy
    zero3 = STRATEGY_REGISTRY.get("thunder_fsdp_zero3")
    assert type(zero3) is ThunderFSDPStrategy
    assert zero3.sharding_strategy is FSDPType.ZERO3
    assert type(STRATEGY_REGISTRY.get("thunder_auto")).__name__ == "ThunderAutoStrategy"


def test_fabric_builds_registered_strategies_by_name():
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, strategy="thunder_ddp")
    assert isinstance(fabric.strategy, ThunderDDPStrategy)


def test_import_thunderviz_does_not_import_thunder_or_ipython():
    """The core and the registration stay light: checked in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys, thunderviz, thunderviz.parallel.decisions, thunderviz.trace.file, thunderviz.render.html\n"
        "from lightning.fabric.strategies import STRATEGY_REGISTRY\n"
        "assert 'thunder_fsdp' in STRATEGY_REGISTRY\n"
        "print(sorted(m for m in ('thunder', 'IPython', 'ipywidgets', 'anywidget') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api_is_sorted_and_importable():
    assert thunderviz.__all__ == sorted(thunderviz.__all__)
    for name in thunderviz.__all__:
        assert getattr(thunderviz, name) is not None


@pytest.mark.parametrize(
    ("given", "expected"),
    [("ZERO2", FSDPType.ZERO2), ("zero3", FSDPType.ZERO3), (FSDPType.ZERO3, FSDPType.ZERO3)],
)
def test_sharding_strategy_accepts_names_and_enums_and_reads_back_the_enum(given, expected):
    strategy = ThunderFSDPStrategy(sharding_strategy=given)
    assert strategy.sharding_strategy is expected
    assert strategy.options.sharding_strategy.value == expected.name  # the decision table stays plain Python


@pytest.mark.parametrize(
    ("given", "level", "name"),
    [
        ("HYBRID_SHARD", FSDPType.ZERO3, "HYBRID_SHARD"),
        ("hybrid", FSDPType.ZERO3, "HYBRID_SHARD"),
        (ShardingStrategy.HYBRID_SHARD, FSDPType.ZERO3, "HYBRID_SHARD"),
        ("_HYBRID_SHARD_ZERO2", FSDPType.ZERO2, "_HYBRID_SHARD_ZERO2"),
        ("hybrid_zero2", FSDPType.ZERO2, "_HYBRID_SHARD_ZERO2"),
        (ShardingStrategy._HYBRID_SHARD_ZERO2, FSDPType.ZERO2, "_HYBRID_SHARD_ZERO2"),
    ],
)
def test_hybrid_sharding_takes_fabrics_and_torchs_names_and_reads_back_its_level(given, level, name):
    strategy = ThunderFSDPStrategy(sharding_strategy=given, device_mesh=(2, 4))
    assert strategy.sharding_strategy is level
    assert str(strategy.options.sharding_strategy) == name
    assert strategy.options.device_mesh == (2, 4)
    assert "mesh 2x4" in strategy.options.summary()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"device_mesh": (2, 2)},
            "You set `ThunderFSDPStrategy(device_mesh=(2, 2), sharding_strategy='ZERO2')`, but only hybrid sharding"
            " uses a mesh",
        ),
        ({"sharding_strategy": "hybrid", "device_mesh": (2, 0)}, "give `(replicas, shard_size)`: two positive"),
        ({"sharding_strategy": "hybrid", "device_mesh": (2, 2, 2)}, "give `(replicas, shard_size)`"),
        ({"sharding_strategy": "FULL_SHARD"}, "'FULL_SHARD' is torch FSDP's name for what is 'ZERO3' here."),
    ],
)
def test_a_mesh_without_hybrid_sharding_or_of_the_wrong_shape_is_refused(given, message):
    with pytest.raises(OptionError) as err:
        ThunderFSDPStrategy(**given)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("NONE", FSDPBucketingStrategy.NONE),
        ("layer", FSDPBucketingStrategy.LAYER),
        (FSDPBucketingStrategy.BLOCK, FSDPBucketingStrategy.BLOCK),
    ],
)
def test_bucketing_strategy_accepts_names_and_enums_and_reads_back_the_enum(given, expected):
    strategy = ThunderFSDPStrategy(bucketing_strategy=given)
    assert strategy.bucketing_strategy is expected
    assert strategy.options.bucketing_strategy.value == expected.name


def test_ddp_bucket_size_reads_back():
    assert ThunderDDPStrategy().bucket_size_in_mb == 25.0
    assert ThunderDDPStrategy(bucket_size_in_mb=0).bucket_size_in_mb == 0.0


def test_jit_keyword_arguments_are_kept_for_the_strategy_jit():
    strategy = ThunderFSDPStrategy(
        executors=["torch"], state_dict_type="full", timeout=None, disable_torch_autograd=False
    )
    assert strategy.executors == ["torch"]
    assert strategy.jit_kwargs == {"disable_torch_autograd": False}
    assert strategy.options.jit_keyword_names == ("disable_torch_autograd",)
    assert strategy.state_dict_type == "full" and strategy.options.fabric_kwargs == (("timeout", None),)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        pytest.param(
            lambda: ThunderFSDPStrategy(sharding_strategy="ZERO1"),
            "You set `ThunderFSDPStrategy(sharding_strategy='ZERO1')`; choose one of 'ZERO2', 'ZERO3', 'HYBRID_SHARD',"
            " '_HYBRID_SHARD_ZERO2' (or thunder's `FSDPType` or torch's `ShardingStrategy` member of the same name).",
            id="sharding",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(sharding_strategy=2),
            "You set `ThunderFSDPStrategy(sharding_strategy=2)`; choose one of 'ZERO2', 'ZERO3', 'HYBRID_SHARD',"
            " '_HYBRID_SHARD_ZERO2' (or thunder's `FSDPType` or torch's `ShardingStrategy` member of the same name).",
            id="sharding-not-a-name",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(bucketing_strategy="ALL"),
            "You set `ThunderFSDPStrategy(bucketing_strategy='ALL')`; choose one of 'NONE', 'LAYER', 'BLOCK' (or"
            " thunder's `FSDPBucketingStrategy` member of the same name).",
            id="bucketing",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(state_dict_type="partial"),
            "You set `ThunderDDPStrategy(state_dict_type='partial')`; it must be 'full' (one torch.save file with"
            " unsharded tensors, loadable anywhere) or 'sharded' (a PyTorch Distributed Checkpoint directory,"
            " loadable at any world size).",
            id="state-dict-type",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(bucket_size_in_mb=-1),
            "You set `ThunderDDPStrategy(bucket_size_in_mb=-1)`; it must be a number >= 0 (megabytes of gradients"
            " per all-reduce; 0 means one all-reduce per parameter).",
            id="bucket-size",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(bucket_size_in_mb=5),
            "You set `ThunderFSDPStrategy(bucket_size_in_mb=...)`, but FSDP buckets parameters by the model's"
            " structure, not by size: use `bucketing_strategy='BLOCK'` (one collective per block), 'LAYER' or"
            " 'NONE'. `bucket_size_in_mb` is `ThunderDDPStrategy`'s knob for its gradient all-reduces.",
            id="fsdp-bucket-size",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(bucketing_strategy="BLOCK"),
            "You set `ThunderDDPStrategy(bucketing_strategy=...)`, but DDP replicates parameters: nothing is sharded"
            " or gathered. Its gradients are all-reduced in buckets of `bucket_size_in_mb` (default 25); for"
            " `bucketing_strategy` use `ThunderFSDPStrategy`.",
            id="ddp-bucketing",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(sharding_strategy="ZERO3"),
            "You set `ThunderDDPStrategy(sharding_strategy=...)`, but DDP replicates parameters: nothing is sharded"
            " or gathered. Its gradients are all-reduced in buckets of `bucket_size_in_mb` (default 25); for"
            " `sharding_strategy` use `ThunderFSDPStrategy`.",
            id="ddp-sharding",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(jit=False, executors=["torch"]),
            "You set `ThunderFSDPStrategy(jit=False, executors=...)`, but with `jit=False` the strategy never calls"
            " `thunder.jit`, so the executors would be silently ignored. Pass them to your own"
            " `thunder.jit(..., executors=...)` call, or set `jit=True`.",
            id="jit-false-executors",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(jit=False, disable_torch_autograd=True, cache="no caching"),
            "You set `ThunderDDPStrategy(jit=False, cache=..., disable_torch_autograd=...)`, but with `jit=False` the"
            " strategy never calls `thunder.jit`, so these thunder.jit arguments would be silently ignored. Pass"
            " them to your own `thunder.jit(...)` call, or set `jit=True`.",
            id="jit-false-jit-kwargs",
        ),
    ],
)
def test_bad_knobs_fail_with_the_fix(factory, message):
    with pytest.raises(OptionError) as err:  # a ValueError, as before
        factory()
    assert str(err.value) == message


def test_meta_init_context_builds_on_meta_and_setup_moves_nothing():
    """``init_module(empty_init=True)`` builds on meta; without it, on the root device (no launch needed)."""
    import torch
    from lightning.fabric import Fabric
    from torch import nn

    strategy = Fabric(accelerator="cpu", devices=1, strategy=ThunderFSDPStrategy()).strategy
    with strategy.module_init_context(empty_init=True):  # what fabric.init_module(empty_init=True) enters
        meta = nn.Linear(3, 2)
    with strategy.module_init_context():
        real = nn.Linear(3, 2)
    assert meta.weight.is_meta and not real.weight.is_meta
    strategy.module_to_device(meta)  # nothing to move: setup materializes it
    assert meta.weight.is_meta
    assert real.weight.device == torch.device("cpu")


def test_fsdp_knobs_are_carried_out_not_warned_about():
    """ZERO3 and every bucketing strategy are implemented (thunder.comm.setup): no "accepted but ignored" warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sharding in ("ZERO2", "ZERO3"):
            for bucketing in ("NONE", "LAYER", "BLOCK"):
                ThunderFSDPStrategy(sharding_strategy=sharding, bucketing_strategy=bucketing)
    assert [str(w.message) for w in caught if "Thunder" in str(w.message)] == []


def test_fsdp_buckets_by_block_unless_told_otherwise():
    assert ThunderFSDPStrategy().bucketing_strategy is FSDPBucketingStrategy.BLOCK


# -- unknown and foreign keywords never pass silently ------------------------------------------------------------------


def test_a_typo_raises_at_construction_naming_the_closest_option():
    with pytest.raises(UnknownOptionError) as err:
        ThunderFSDPStrategy(shardng_strategy="ZERO3")
    assert isinstance(err.value, TypeError)  # as any unexpected keyword
    assert "Did you mean `sharding_strategy`?" in str(err.value)
    with pytest.raises(UnknownOptionError, match="Did you mean `disable_torch_autograd`"):
        ThunderDDPStrategy(disable_torch_autograde=True)  # closest among what thunder.jit reads


def test_only_keywords_the_installed_thunder_jit_reads_pass_through():
    """Checked against thunder itself: jit's signature and the compile options its modules look up."""
    import inspect

    import thunder

    from thunderviz.thunder.jit.keywords import jit_keywords

    accepted = jit_keywords()
    assert {"cache", "sharp_edges", "disable_torch_autograd", "transforms", "debug_options"} <= accepted
    assert {"skip_inplace_alias_updates", "auto_recompute_intermediates"} <= accepted  # read via compile_options
    assert "executors" not in accepted  # the strategy's own option
    params = inspect.signature(thunder.jit).parameters.values()
    named = {p.name for p in params if p.kind is p.KEYWORD_ONLY} - {"executors"}
    assert named <= accepted
    strategy = ThunderFSDPStrategy(skip_inplace_alias_updates=True)
    assert strategy.jit_kwargs == {"skip_inplace_alias_updates": True}
    with pytest.raises(UnknownOptionError, match=r"not an option of ThunderFSDPStrategy or a keyword of `thunder"):
        ThunderFSDPStrategy(frobnicate=1)


def _fabric_and_torch_option_names(parallelism: Parallelism) -> set[str]:
    """What a user of Lightning's own strategy could pass: its constructor, and torch's wrapper it forwards to."""
    import inspect

    import torch.distributed.fsdp as torch_fsdp
    from lightning.fabric.strategies import DDPStrategy, FSDPStrategy
    from torch.nn.parallel import DistributedDataParallel

    if parallelism is Parallelism.FSDP:
        sources = (FSDPStrategy.__init__, torch_fsdp.FullyShardedDataParallel.__init__)
    else:
        sources = (DDPStrategy.__init__, DistributedDataParallel.__init__)
    names: set[str] = set()
    for fn in sources:
        for name, p in inspect.signature(fn).parameters.items():
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name not in ("self", "module"):
                names.add(name)
    return names


@pytest.mark.parametrize("parallelism", list(Parallelism))
def test_every_option_of_fabrics_own_strategy_is_taken_or_refused_with_what_to_use(parallelism):
    """Checked against the installed Lightning and torch, so the list of foreign options cannot drift."""
    ours = {o.name for o in OPTIONS if o.applies(parallelism)}
    # ours for the other strategy (torch DDP's `device_mesh` is FSDP's hybrid mesh here): refused with what to use
    elsewhere = {o.name: o.elsewhere for o in OPTIONS if not o.applies(parallelism)}
    theirs = _fabric_and_torch_option_names(parallelism)
    assert theirs - ours - set(elsewhere) - set(FOREIGN_OPTIONS) == set()
    cls = ThunderFSDPStrategy if parallelism is Parallelism.FSDP else ThunderDDPStrategy
    for name in sorted(theirs - ours):
        with pytest.raises(OptionError) as err:
            cls(**{name: object()})
        if name in elsewhere:
            assert str(err.value) == f"You set `{cls.__name__}({name}=...)`, " + elsewhere[name].format(name=name)
            continue
        assert f"You set `{cls.__name__}({name}=...)`, an option of Lightning's" in str(err.value)
        assert FOREIGN_OPTIONS[name] in str(err.value)


def test_fabric_fsdp_spelling_of_activation_checkpointing_says_what_to_do():
    """``activation_checkpointing_policy`` is implemented; Fabric's older spelling says to use it."""
    from torch import nn

    from thunderviz.parallel.option_values import CheckpointPolicy

    policy = ThunderFSDPStrategy(activation_checkpointing_policy={nn.Linear}).options.activation_checkpointing_policy
    assert policy == CheckpointPolicy(classes=(nn.Linear,))
    with pytest.raises(OptionError) as err:
        ThunderFSDPStrategy(activation_checkpointing={nn.Linear})
    assert str(err.value) == (
        "You set `ThunderFSDPStrategy(activation_checkpointing=...)`, an option of Lightning's FSDPStrategy (or"
        " torch's FSDP) that thunderviz does not take: it is Fabric's deprecated spelling; pass the same module"
        " classes as `activation_checkpointing_policy={Block}` (a set of classes, class names, or a callable"
        " `module -> bool`)."
    )


def test_the_signature_and_docstring_are_the_option_table():
    import inspect

    for cls in (ThunderFSDPStrategy, ThunderDDPStrategy):
        params = inspect.signature(cls).parameters
        declared = [o for o in OPTIONS if o.applies(cls.parallelism)]
        assert list(params)[:-1] == [o.name for o in declared] and "jit_kwargs" in params
        for o in declared:
            assert params[o.name].default == o.default_for(cls.parallelism)
            if not o.fabric:
                assert f"{o.name}: {o.help}" in inspect.getdoc(cls)
    assert inspect.signature(ThunderDDPStrategy).parameters["state_dict_type"].default == "full"
    assert "sharding_strategy" not in inspect.signature(ThunderDDPStrategy).parameters

"""Strategy construction and registration, without processes."""

from __future__ import annotations

import warnings

import pytest
from lightning.fabric.strategies import STRATEGY_REGISTRY
from thunder.distributed import FSDPType

import thunderviz
from thunderviz import ThunderDDPStrategy, ThunderFSDPStrategy
from thunderviz.strategies import base


def test_exact_names_registered_with_fabric():
    names = {n for n in STRATEGY_REGISTRY.available_strategies() if n.startswith("thunder")}
    assert names == {"thunder_fsdp", "thunder_fsdp_zero3", "thunder_ddp"}
    assert type(STRATEGY_REGISTRY.get("thunder_fsdp")) is ThunderFSDPStrategy
    assert type(STRATEGY_REGISTRY.get("thunder_ddp")) is ThunderDDPStrategy
    zero3 = STRATEGY_REGISTRY.get("thunder_fsdp_zero3")
    assert (type(zero3), zero3.options.sharding_strategy) == (ThunderFSDPStrategy, "ZERO3")


def test_fabric_builds_registered_strategies_by_name():
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, strategy="thunder_ddp")
    assert isinstance(fabric.strategy, ThunderDDPStrategy)


def test_import_thunderviz_does_not_import_thunder_or_ipython():
    """The core and the registration stay light: checked in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys, thunderviz, thunderviz.core.decisions, thunderviz.core.traces, thunderviz.render.html\n"
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


def test_knobs_accept_strings_and_thunder_enums():
    assert ThunderFSDPStrategy(sharding_strategy=FSDPType.ZERO2).options.sharding_strategy == "ZERO2"
    assert ThunderFSDPStrategy(bucketing_strategy="layer").options.bucketing_strategy == "LAYER"
    strategy = ThunderFSDPStrategy(executors=["torch"], state_dict_type="full", timeout=None, disable_torch_autograd=False)
    assert strategy.executors == ["torch"]
    assert strategy.jit_kwargs == {"disable_torch_autograd": False}


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        pytest.param(
            lambda: ThunderFSDPStrategy(sharding_strategy="ZERO1"),
            "You set `ThunderFSDPStrategy(sharding_strategy='ZERO1')`; choose one of 'ZERO2', 'ZERO3' (or thunder's"
            " enum member of the same name).",
            id="sharding",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(bucketing_strategy="ALL"),
            "You set `ThunderFSDPStrategy(bucketing_strategy='ALL')`; choose one of 'NONE', 'LAYER', 'BLOCK' (or"
            " thunder's enum member of the same name).",
            id="bucketing",
        ),
        pytest.param(
            lambda: ThunderDDPStrategy(state_dict_type="partial"),
            "You set `ThunderDDPStrategy(state_dict_type='partial')`; it must be 'full' (one file with unsharded"
            " tensors, loadable at any world size) or 'sharded' (one file per rank).",
            id="state-dict-type",
        ),
        pytest.param(
            lambda: ThunderFSDPStrategy(jit=False, executors=["torch"]),
            "You set `ThunderFSDPStrategy(jit=False, executors=...)`, but with `jit=False` the strategy never calls"
            " `thunder.jit`, so the executors would be silently ignored. Pass them to your own"
            " `thunder.jit(..., executors=...)` call, or set `jit=True`.",
            id="jit-false-executors",
        ),
    ],
)
def test_bad_knobs_fail_with_the_fix(factory, message):
    with pytest.raises(ValueError) as err:
        factory()
    assert str(err.value) == message


def test_zero3_warns_once_per_process():
    base._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ThunderFSDPStrategy(sharding_strategy="ZERO3")
        ThunderFSDPStrategy(sharding_strategy="ZERO3")
    messages = [str(w.message) for w in caught if "ZERO3" in str(w.message)]
    assert messages == [
        "ThunderFSDPStrategy: ZERO3 was requested, but thunder 0.2.6 traces it exactly like ZERO2 (no re-gather in"
        " backward; the unsharded weight is kept for backward)."
    ]

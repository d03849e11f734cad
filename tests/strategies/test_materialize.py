"""Meta-device materialization on one process: the reference the ranks must equal, and its errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from thunderviz.strategies.materialize import MaterializationError, has_meta_tensors, materialize_


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 1)


def test_same_resets_in_construction_order_equal_eager_construction():
    torch.manual_seed(3)
    eager = MLP()
    torch.manual_seed(3)
    with torch.device("meta"):
        model = MLP()
    assert has_meta_tensors(model)
    replaced = materialize_(model, torch.device("cpu"))
    assert not has_meta_tensors(model)
    assert len(replaced) == 6
    for (name, got), (_, want) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        assert torch.equal(got, want), name


def test_keep_sees_each_parameter_once_right_after_its_module():
    seen = []
    with torch.device("meta"):
        model = MLP()
    materialize_(model, torch.device("cpu"), keep=lambda name, p: seen.append((name, p.is_meta)))
    assert seen == [
        ("fc1.weight", False),
        ("fc1.bias", False),
        ("norm.weight", False),
        ("norm.bias", False),
        ("fc2.weight", False),
        ("fc2.bias", False),
    ]


def test_optimizer_and_tied_weights_follow_the_new_objects():
    with torch.device("meta"):
        emb = nn.Embedding(5, 4)
        head = nn.Linear(4, 5, bias=False)
        head.weight = emb.weight
        model = nn.Sequential(emb, head)
    old = emb.weight
    replaced = materialize_(model, torch.device("cpu"))
    assert model[0].weight is model[1].weight is replaced[id(old)]
    assert not model[1].weight.is_meta


class NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))


class ResetsChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.own = nn.Parameter(torch.empty(2))
        self.child = nn.Linear(2, 2)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.own)
        self.child.reset_parameters()


def test_module_without_reset_parameters_is_named():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 3), NoReset())
    with pytest.raises(MaterializationError) as err:
        materialize_(model, torch.device("cpu"))
    assert str(err.value) == (
        "`fabric.setup` cannot initialize '1' (NoReset), built on the meta device"
        " (`fabric.init_module(empty_init=True)`):"
        " it owns 1.w but has no `reset_parameters()` method. Give NoReset a `reset_parameters()` that initializes"
        " its own parameters and buffers, or build the model without `empty_init=True`."
    )


def test_reset_that_writes_another_modules_tensor_is_refused():
    with torch.device("meta"):
        model = ResetsChild()
    with pytest.raises(MaterializationError) as err:
        materialize_(model, torch.device("cpu"))
    assert str(err.value) == (
        "`ResetsChild.reset_parameters()` of 'ResetsChild' changed child.bias, child.weight, which it does not own (a"
        " child module's tensor or a tied weight). Modules are materialized one at a time, parents first, and each"
        " rank keeps only its shard at once, so that write cannot be reproduced. Make"
        " ResetsChild.reset_parameters() initialize only its own parameters and buffers (tie weights after"
        " `fabric.setup`, or let the child's own reset_parameters() do its part)."
    )

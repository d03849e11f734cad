"""Gradient clipping maths on one process (replicated/untagged parameters need no collective)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from thunderviz.strategies import clipping


def _two_models():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
    b = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
    b.load_state_dict(a.state_dict())
    x = torch.randn(6, 5)
    for m in (a, b):
        (m(x) ** 2).sum().backward()
    return a, b


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, float("inf"), "inf"])
def test_norm_clipping_equals_torch(norm_type):
    ours, theirs = _two_models()
    got = clipping.clip_grad_norm_(ours.parameters(), 0.1, norm_type=norm_type)
    want = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.1, norm_type=float(norm_type))
    torch.testing.assert_close(got, want)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_value_clipping_equals_torch():
    ours, theirs = _two_models()
    clipping.clip_grad_value_(ours.parameters(), 0.05)
    torch.nn.utils.clip_grad_value_(theirs.parameters(), 0.05)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_non_finite_norm_raises_with_the_fix():
    ours, _ = _two_models()
    next(ours.parameters()).grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError) as err:
        clipping.clip_grad_norm_(ours.parameters(), 1.0)
    assert str(err.value) == (
        "The total norm of order 2.0 of the gradients is non-finite (nan), so `fabric.clip_gradients` cannot clip"
        " them (every rank sees the same global norm). Find where the gradients overflow, or pass"
        " `error_if_nonfinite=False` to scale them by the non-finite norm anyway."
    )


def test_bad_norm_type_is_named():
    ours, _ = _two_models()
    with pytest.raises(ValueError, match=r"norm_type=-1.*positive number or 'inf'"):
        clipping.clip_grad_norm_(ours.parameters(), 1.0, norm_type=-1)


def test_no_gradients_gives_zero():
    assert float(clipping.global_grad_norm([nn.Parameter(torch.ones(2))])) == 0.0

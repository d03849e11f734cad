"""A model thunder cannot trace, set up by our strategies: the error names the module (its qualified name), the
Python line, the op thunder stopped at and what to do, with thunder's own error as its cause. One process: the
failure happens in thunder's interpreter, before any collective, so marking the model as set up is enough."""

from __future__ import annotations

import pytest
import thunder
import torch
from torch import nn

from thunderviz.errors import UntraceableModelError
from thunderviz.thunder.reuse import compile_reuse


class PositiveSum(nn.Module):
    """Sums the positive entries by boolean indexing, whose result's shape thunder cannot know when tracing."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * y[y > 0].sum()


class NumpyRound(nn.Module):
    """Rounds through NumPy, which thunder cannot trace."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y + torch.from_numpy(y.detach().numpy().round())


class Tower(nn.Module):
    def __init__(self, odd: nn.Module) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 7)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(7, 7)), nn.Sequential(nn.Linear(7, 7), odd)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(
    ("odd", "line", "op", "cause", "advice"),
    [
        (
            PositiveSum(7),
            "return y * y[y > 0].sum()",
            "boolean advanced indexing",
            NotImplementedError,
            "rewrite that line",
        ),
        (
            NumpyRound(7),
            "return y + torch.from_numpy(y.detach().numpy().round())",
            "numpy",
            NotImplementedError,
            "rewrite that line",
        ),
    ],
    ids=["boolean-index", "numpy"],
)
def test_untraceable_module_is_named_with_line_op_and_fix(odd, line, op, cause, advice):
    model = Tower(odd)
    compile_reuse.install()
    compile_reuse.mark(model, True)  # what a strategy's setup does
    with pytest.raises(UntraceableModelError) as info:
        thunder.jit(model)(torch.randn(3, 5))
    err = info.value
    assert isinstance(err.__cause__, cause), "thunder's own error stays reachable as the cause"
    failure = err.failure
    assert (failure.module, failure.module_class, failure.source, failure.op) == (
        "blocks.1.1",
        type(odd).__name__,
        line,
        op,
    )
    text = str(err)
    assert text.startswith(f"thunder could not trace `blocks.1.1` ({type(odd).__name__}): it stopped at")
    assert f"test_untraceable.py:{failure.line} in {type(odd).__name__}.forward" in text and line in text
    assert "What to do:" in text and advice in text


def test_a_jit_our_strategies_did_not_set_up_keeps_thunders_error():
    compile_reuse.install()
    with pytest.raises(NotImplementedError, match="numpy"):
        thunder.jit(Tower(NumpyRound(7)))(torch.randn(3, 5))


class WrongShape(nn.Module):
    """A bug in the model itself: eager torch refuses this matmul too."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) @ torch.ones(3, 3)


def test_an_error_in_the_model_itself_is_not_called_untraceable():
    """A shape mismatch thunder's meta function refuses, as eager would: thunder's own error, not advice to rewrite
    the line for thunder or to train without it."""
    model = Tower(WrongShape(7))
    compile_reuse.install()
    compile_reuse.mark(model, True)
    with pytest.raises(RuntimeError, match="matrix multip") as info:
        thunder.jit(model)(torch.randn(3, 5))
    assert not isinstance(info.value, UntraceableModelError)

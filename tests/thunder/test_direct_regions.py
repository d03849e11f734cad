"""Regions called straight into inductor's compiled code (thunderviz/thunder/jit/direct_regions.py): the same values
as Dynamo's path, and Dynamo's path wherever skipping its guards would not be safe.

The strategies' 2-rank numerics tests run every region of ours through this path; these pin the refusals one by one
on a torch.compile'd function as thunder's torchcompile executor builds it (fullgraph, under no_grad).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from thunderviz.thunder.jit import direct_regions


def _region(fn):
    """A region as thunder's make_compiled returns it: torch.compile(fullgraph=True) under thunder's no_grad."""
    return torch.no_grad()(torch.compile(fn, fullgraph=True))


def _block(x, w, b):
    h = torch.nn.functional.gelu(x @ w.t() + b)
    return h * 2, h.sum(0)


def _args():
    torch.manual_seed(0)
    return torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)


@torch.no_grad()
def _call(region, *args):
    """As thunder's traces call their regions: under no_grad (and no autocast)."""
    return region(*args)


def _counting(region: direct_regions.DirectRegion, by_path: dict[str, int] | None = None) -> list[int]:
    """Count the calls that reach the directly compiled graph, wrapped by AOTAutograd or not (wraps both after the
    region's first call compiled it); ``by_path`` also counts them apart ("wrapped", "straight")."""
    calls = [0]
    compiled, straight = region._compiled, region._straight
    assert compiled is not None and compiled is not region._guarded

    def count(path: str) -> None:
        calls[0] += 1
        if by_path is not None:
            by_path[path] += 1

    def counted(*args):
        count("wrapped")
        return compiled(*args)

    def counted_straight(args):
        count("straight")
        return straight(args)

    region._compiled = counted
    if straight is not None:
        region._straight = counted_straight
    return calls


def test_a_region_gives_dynamos_values_and_its_later_calls_skip_dynamo() -> None:
    from torch._dynamo.utils import counters

    region = direct_regions.direct(_region(_block), None)
    assert isinstance(region, direct_regions.DirectRegion)
    before = direct_regions.counts()
    bypassed = counters["inductor"]["fxgraph_cache_bypass"]
    x, w, b = _args()
    out = _call(region, x, w, b)
    assert direct_regions.counts()["direct"] == before["direct"] + 1
    # compiled through inductor's cache, as Dynamo's regions are (without it, every process compiles every region)
    assert counters["inductor"]["fxgraph_cache_bypass"] == bypassed
    calls = _counting(region)
    again = _call(region, x, w, b)
    expected = _block(x, w, b)
    for got in (out, again):
        torch.testing.assert_close(got, expected)
    assert calls == [1]
    with torch.enable_grad():  # not how thunder calls a region: Dynamo's path, which sets no_grad itself
        outside = region(x, w, b)
    assert calls == [1] and not outside[0].requires_grad
    torch.testing.assert_close(outside, expected)


def test_inputs_laid_out_unlike_the_first_calls_are_answered_by_dynamos_path_from_then_on() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    _call(region, x, w, b)
    calls = _counting(region)
    before = direct_regions.counts()
    w_transposed = w.t().contiguous().t()  # same shape and values, other strides
    torch.testing.assert_close(_call(region, x, w_transposed, b), _block(x, w, b))
    assert direct_regions.counts()["refused"] == before["refused"] + 1
    assert calls == [1]  # reached the compiled graph, which refused at its stride assertions
    _call(region, x, w, b)
    assert calls == [1]  # Dynamo's guards from then on


def test_a_region_is_compiled_for_its_first_calls_shapes_as_dynamo_compiles_a_first_call() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    _call(region, x, w, b)
    before = direct_regions.counts()
    # thunder's prologue never lets other shapes reach a region; compiled shape-generic (as AOTAutograd compiles
    # real tensors in a context with a shape environment), this call would run the direct graph instead of failing
    # its size assertions
    torch.testing.assert_close(_call(region, x[:4], w, b), _block(x[:4], w, b))
    assert direct_regions.counts()["refused"] == before["refused"] + 1


def test_with_nothing_for_aotautograd_to_do_later_calls_skip_its_wrapper_except_under_the_profiler() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    _call(region, x, w, b)
    assert region._straight is not None
    paths = {"wrapped": 0, "straight": 0}
    _counting(region, paths)
    out = _call(region, x, w, b)
    assert paths == {"wrapped": 0, "straight": 1} and isinstance(out, list)
    torch.testing.assert_close(out, list(_block(x, w, b)))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        _call(region, x, w, b)
    assert paths == {"wrapped": 1, "straight": 1}


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_while_a_dispatch_mode_is_active_calls_take_dynamos_path() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    _call(region, x, w, b)
    calls = _counting(region)
    with _Seen() as seen:
        out = _call(region, x, w, b)
    torch.testing.assert_close(out, _block(x, w, b))
    assert calls == [0]
    assert seen.ops  # Dynamo's path showed the mode the ops, as it would without thunderviz


def test_a_first_call_under_a_mode_leaves_the_direct_compile_to_a_later_call() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    before = direct_regions.counts()
    with _Seen():
        torch.testing.assert_close(_call(region, x, w, b), _block(x, w, b))
    assert direct_regions.counts() == before  # nothing decided under the mode (a metered first step)
    _call(region, x, w, b)
    assert direct_regions.counts()["direct"] == before["direct"] + 1


def test_a_region_taking_a_number_is_left_to_dynamo() -> None:
    def scaled(x, k):
        return x * k

    region = direct_regions.direct(_region(scaled), None)
    before = direct_regions.counts()
    x = torch.randn(4)
    torch.testing.assert_close(_call(region, x, 2.0), x * 2.0)
    torch.testing.assert_close(_call(region, x, 3.0), x * 3.0)  # a number baked into a graph would give x * 2 here
    assert direct_regions.counts()["guarded"] == before["guarded"] + 1


def test_a_region_first_called_with_one_tensor_as_two_arguments_is_left_to_dynamo() -> None:
    def weighted(a, b):
        return (a * 2 + b * 3).sin()

    region = direct_regions.direct(_region(weighted), None)
    before = direct_regions.counts()
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(_call(region, x, x), weighted(x, x))
    # compiled for the first call's (x, x), a direct graph took one argument and computed weighted(x, x) here
    torch.testing.assert_close(_call(region, x, y), weighted(x, y))
    assert direct_regions.counts()["guarded"] == before["guarded"] + 1


def test_outputs_that_alias_inputs_stay_views_of_them() -> None:
    def viewed(x):
        return x.view(2, 8), x + 1

    region = direct_regions.direct(_region(viewed), None)
    x = torch.randn(16)
    _call(region, x)
    view, plus = _call(region, x)
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(plus, x + 1)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_a_region_with_a_compile_mode_is_left_as_thunder_built_it(mode: str) -> None:
    built = _region(_block)
    assert direct_regions.direct(built, mode) is built


def test_a_region_that_writes_into_an_input_is_left_to_dynamo() -> None:
    def updated(buffer, x):
        buffer.copy_(buffer * 0.9 + x * 0.1)  # a running average, as thunder's copy_ of a module buffer
        return buffer + 1

    region = direct_regions.direct(_region(updated), None)
    before = direct_regions.counts()
    buffer, x = torch.zeros(4), torch.ones(4)
    _call(region, buffer, x)
    torch.testing.assert_close(buffer, torch.full((4,), 0.1))
    assert direct_regions.counts()["guarded"] == before["guarded"] + 1


def test_under_the_profiler_a_direct_region_is_labelled_as_inductor_labels_it() -> None:
    region = direct_regions.direct(_region(_block), None)
    x, w, b = _args()
    _call(region, x, w, b)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = _call(region, x, w, b)
    torch.testing.assert_close(out, _block(x, w, b))
    assert any("Call CompiledFxGraph" in e.name for e in prof.events())

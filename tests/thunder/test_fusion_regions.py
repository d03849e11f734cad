"""Opening torchcompile regions after thunder's rematerialization (fusion_regions.open_regions).

Thunder's fusion pass recomputes cheap producer ops inside the consumer region under the same names; on the H200
(regions cut at the sdpa executor's attention) opening both regions defined those names twice and re-fusing
failed with "Trying to add the name ... already used". Here an opaque operator executor op plays the part of
sdpa on CPU: it cuts the trace into two torchcompile regions, and rematerialization copies ``sin``/``cos`` into the
second one. Inside ``uncompiled_fusions`` (what the memory plan's rehearsal uses) thunder builds the same regions and
rematerializes the same way, but runs each region's ops instead of compiling them with inductor (10 s of C++
compile here, which the bug has nothing to do with).
"""

from __future__ import annotations

import collections

import thunder
import torch
from thunder.core.trace import from_trace
from thunder.core.transform_common import dce
from thunder.extend import OperatorExecutor, register_executor

from thunderviz.thunder.comm.fusion_regions import open_regions, refuse
from thunderviz.thunder.jit.executors import uncompiled_fusions

_opaque_ex = OperatorExecutor("thunderviz_test_opaque", version="0")
register_executor(_opaque_ex)
opaque = _opaque_ex.register_operator("opaque", meta=lambda t: thunder.TensorProxy(like=t), fn=lambda t: t * 1.0)


def _cut_in_two(x):
    a = torch.sin(x)
    b = torch.cos(a)
    e = opaque(torch.exp(a))
    return b * e + b


def _definitions(bsyms) -> collections.Counter:
    return collections.Counter(p.name for b in bsyms for p in b.flat_proxy_outs)


def test_rematerialized_copies_are_opened_once_and_refuse_computes_the_same():
    with uncompiled_fusions():
        _opened_once_and_computes_the_same()


def _opened_once_and_computes_the_same():
    jitted = thunder.jit(_cut_in_two, executors=[_opaque_ex, "torchcompile"])
    x = torch.randn(8)
    expected = jitted(x)
    b = torch.cos(torch.sin(x))
    torch.testing.assert_close(expected, b * torch.exp(torch.sin(x)) + b)
    trace = thunder.last_traces(jitted)[-1]
    regions = [b for b in trace.bound_symbols if b.sym.is_fusion]
    assert len(regions) == 2
    # the precondition this test exists for: both regions define the same names
    shared = _definitions(regions[0].subsymbols).keys() & _definitions(regions[1].subsymbols).keys()
    assert shared, "rematerialization did not copy ops into the consumer: the test no longer covers the H200 failure"

    opened, executors = open_regions(trace.bound_symbols)
    assert executors and all(n == 1 for n in _definitions(opened).values()), _definitions(opened)
    fused, bsyms = refuse(from_trace(trace), [b for b in opened if b.sym.name != "del"], executors)
    assert sum(b.sym.is_fusion for b in bsyms) == 2
    (out,) = dce(fused).python_callable()(x)
    torch.testing.assert_close(out, expected)


def _positions_after_a_cut(x):
    # as a GPT's positions: made from constants at the top of the trace
    pos = torch.arange(8, dtype=torch.float32, device=x.device)
    return opaque(x) * 2 + pos


def test_a_tensor_made_from_constants_joins_the_region_that_uses_it():
    """Where our pass issues collectives at the top of a trace, thunder fused a GPT's ``arange`` into a region of
    its own: one more region call every step. Re-fused, it is made in the region that reads it."""
    with uncompiled_fusions():
        jitted = thunder.jit(_positions_after_a_cut, executors=[_opaque_ex, "torchcompile"])
        x = torch.randn(8)
        expected = jitted(x)
        trace = thunder.last_traces(jitted)[-1]
        assert sum(b.sym.is_fusion for b in trace.bound_symbols) == 2  # the arange alone, then the rest
        opened, executors = open_regions(trace.bound_symbols)
        fused, bsyms = refuse(from_trace(trace), [b for b in opened if b.sym.name != "del"], executors)
        assert sum(b.sym.is_fusion for b in bsyms) == 1
        (out,) = dce(fused).python_callable()(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, x * 2 + torch.arange(8, dtype=torch.float32))

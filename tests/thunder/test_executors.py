"""thunder's fusion executors made safe around collectives, and the facts the executor rule reads."""

from __future__ import annotations

import thunder.distributed.prims as dist_prims
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.executors.torchex import ex as torch_ex
from thunder.extend import ImplInfo, deregister_executor, register_executor

from thunderviz.thunder.jit.executors import executor_facts, keep_collectives_out_of_fusions


def _claims_collectives(executor: object) -> list:
    return [op for op in executor._implmap if isinstance(op, dist_prims.PrimIDs)]


def test_no_fusion_executor_claims_a_collective_even_one_registered_later():
    keep_collectives_out_of_fusions()
    assert _claims_collectives(torch_compile_ex) == [] and torch_compile_ex._implmap  # the rest stays claimed
    mine = TorchCompileExecutor(name="thunderviz_test_tc")
    mine._implmap = {op: ImplInfo() for op in torch_ex.implmap}
    register_executor(mine)
    try:
        assert _claims_collectives(mine)
        assert keep_collectives_out_of_fusions() > 0 and _claims_collectives(mine) == []
        assert _claims_collectives(torch_ex), "the torch executor must still run the collectives"
    finally:
        deregister_executor(mine)


def test_facts_name_what_is_registered_and_whether_inductor_compiles():
    facts = executor_facts("cpu")
    assert {"torch", "sdpa", "torchcompile"} <= set(facts.installed) and "nvfuser" not in facts.installed
    assert facts.defaults and facts.inductor_ok is (facts.inductor_problem == "")
    if not facts.inductor_ok:  # a machine without a C++ compiler: the reason says what to install
        assert "no C++ compiler was found" in facts.inductor_problem

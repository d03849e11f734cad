"""litgpt's executor list (``sdpa, torchcompile, nvfuser, torch``) under both strategies, in cases 1, 2 and 3, on 2
gloo ranks against one eager process.

What it guards: thunder's ``torchcompile`` executor used to take our collectives into its fusion regions (an
IndexError in case 1 and 3, Dynamo refusing async collectives in case 2). Here every case trains like one process,
the trace has fusion regions, none of them holds a collective or a wait, and the collectives per step are the
ones without a fusion executor (test_training_2rank.py asserts the same counts there). Case 1 passes the list with
``nvfuser`` to the strategy, which leaves it out (not installed here) with a warning; cases 2 and 3 pass it to the
user's own ``thunder.jit`` less nvFuser, which thunder.jit itself would refuse. Tolerance: torch.testing's float32
default (rtol 1.3e-6, atol 1e-5) held for inductor's fused C++ kernels on these models.

Over a minute (about 80 s beside the other pytest worker), in the module fixture: ten set-ups through thunder and
inductor, whose C++ compiles of the fusion regions start from a cold cache on a fresh machine.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.common import run_many
from tests.strategies.scenarios import train

LITGPT_EXECUTORS = ("sdpa", "torchcompile", "nvfuser", "torch")
KINDS = {"fsdp-zero2": ("fsdp", "ZERO2"), "fsdp-zero3": ("fsdp", "ZERO3"), "ddp": ("ddp", "ZERO2")}
CASES = {"raw": "case 1", "jitted_ran": "case 3", "function": "case 2"}
# The MLP in every case; a LayerNorm model under ZERO3, where a fusion region's input is the unsharded LayerNorm weight
# itself (thunder's rematerialization keeps region inputs), which backward must gather again.
SCENARIOS = [(kind, case, "mlp") for kind in KINDS for case in CASES] + [("fsdp-zero3", "raw", "embed_norm")]


@pytest.fixture(scope="module")
def results():
    args = [
        (KINDS[k][0], case, model, KINDS[k][1], False, None, False, LITGPT_EXECUTORS) for k, case, model in SCENARIOS
    ]
    return run_on_pool(run_many, train, args, timeout=900)


@pytest.mark.parametrize(("kind", "case", "model"), SCENARIOS)
def test_litgpt_executors_train_like_one_process(results, kind, case, model):
    index = SCENARIOS.index((kind, case, model))
    for per_rank in results:
        r = per_rank[index]
        ref = r["ref"]
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref["losses"]))
        for name in ref["grads"]:
            torch.testing.assert_close(r["grads"][name], ref["grads"][name], msg=f"grad of {name}")
        for name in ref["params"]:
            torch.testing.assert_close(r["params"][name], ref["params"][name], msg=f"{name} after 3 steps")
    r0 = results[0][index]
    assert r0["fusions"], "torchcompile made no fusion region: the executors did not reach thunder.jit"
    assert all(f["collectives"] == [] for f in r0["fusions"]), r0["fusions"]
    # Regions end only where a bucket's collective sits (fusion_regions.refuse), not at every parameter's: thunder
    # fused before our pass moved the per-parameter collectives, which left one region per parameter in backward.
    for trace, regions in zip(("forward", "backward"), r0["region_counts"], strict=True):
        collectives = sum(r0[f"{trace}_collectives"].values())
        assert regions <= collectives + 1, f"{trace}: {regions} fusion regions around {collectives} collectives"
    # the trace model keeps each forward region as one op naming what it fuses (drawn as one node)
    captured = r0["captured_fusions"]
    assert captured and all(name.startswith("TorchCompile") and fused for name, fused in captured), captured
    strategy, sharding = KINDS[kind]
    if strategy == "fsdp":
        again = sharding == "ZERO3"
        assert r0["forward_collectives"] == {"all_gather": 1, "wait": 1}
        assert r0["backward_collectives"] == {
            "reduce_scatter": 1,
            "wait": 1 + again,
            **({"all_gather": 1} if again else {}),
        }
    else:
        assert r0["backward_collectives"] == {"all_reduce": 1, "wait": 1}
    how, placed = r0["decisions"]
    assert placed["case"].startswith(CASES[case]) and how["action"] == "choose executors"
    if case == "raw":
        assert how["executors"] == ["sdpa", "torchcompile", "torch"]
        assert "nvfuser is not installed here" in how["warning"]
    elif case == "jitted_ran":
        # as thunder keeps them: the user's list, then its always-on python executor
        assert how["executors"] == ["sdpa", "torchcompile", "torch", "python"] and "your thunder.jit" in how["headline"]
    else:
        assert how["executors"] == [] and "your thunder.jit" in how["headline"]

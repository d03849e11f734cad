"""The front doors users bring to ``fabric.setup`` (``thunder.compile`` with a recipe or a plugin, ``thunderfx``,
``torch.compile(model, backend=ThunderCompiler())``) under both strategies on 2 gloo ranks: each trains like one eager
process or is refused before anything runs with a thunderviz error naming the front door and the fix."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.front_door_scenarios import both

KINDS = ["fsdp", "ddp"]


@pytest.fixture(scope="module")
def results():
    return run_on_pool(both, timeout=900)


def _like_one_process(results, kind, door):
    ref = results[0][kind]["reference"]
    for rank, out in enumerate(results):
        torch.testing.assert_close(
            torch.tensor(out[kind][door]["losses"]), torch.tensor(ref), atol=1e-4, rtol=0, msg=f"rank {rank}"
        )


@pytest.mark.parametrize("kind", KINDS)
def test_thunder_compile_with_a_recipe_is_case_3_named_by_its_recipe(results, kind):
    _like_one_process(results, kind, "compile")
    r = results[0][kind]["compile"]
    assert r["decision"]["case"] == "case 3: module already jitted by the user"
    assert "thunder.compile'd module" in r["decision"]["headline"]
    call = "thunder.compile(model, recipe=BaseRecipe(fuser='torch.compile'))"
    assert call in r["decision"]["reason"]
    assert f"(your {call}'s)" in r["executors"]["headline"] and "torchcompile" in r["executors"]["headline"]
    assert "your thunder.jit's" not in r["executors"]["headline"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plugin", ["FSDP", "DDP"])
def test_thunders_distributing_plugins_are_refused_before_setup_runs(results, kind, plugin):
    for out in results:
        r = out[kind][f"plugin {plugin}"]
        assert r["type"] == "JitDecisionError", r["error"]
        assert f"thunder's {plugin} plugin" in r["error"]
        assert f"plugins=[thunder.plugins.{plugin}(...)]" in r["error"]
        assert "without that plugin" in r["error"] and "use thunder's plugin alone" in r["error"]
        assert "meta tensor" not in r["error"] and "thunder.distributed" not in r["error"]
        assert r["decision"]["case"] == "not possible"


@pytest.mark.parametrize("kind", KINDS)
def test_thunderfx_is_refused_naming_what_to_pass(results, kind):
    for out in results:
        r = out[kind]["thunderfx"]
        assert r["type"] == "JitDecisionError", r["error"]
        assert (
            "`thunderfx(model)`" in r["error"]
            and "Hand `fabric.setup` the module you passed to thunderfx" in r["error"]
        )


@pytest.mark.parametrize("kind", KINDS)
def test_torch_compile_with_thunders_backend_is_jitted_once_and_passed_through(results, kind):
    _like_one_process(results, kind, "torch.compile")
    r = results[0][kind]["torch.compile"]
    assert r["decision"]["case"] == "case 1: raw module"
    assert "(Dynamo passes through)" in r["decision"]["headline"]
    assert r["compiled_again"] == "OptimizedModule", "Fabric compiled the set-up module again, as it always does"

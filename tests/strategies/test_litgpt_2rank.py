"""litgpt's GPT (random init, tiny config) in litgpt's pretraining order on 2 gloo ranks, against one process.

Needs litgpt (the ``test`` extra; without its heavy extras: ``pip install --no-deps litgpt==0.5.13 safetensors``
is enough for ``from litgpt import GPT, Config``).

Over a minute (about 100 s beside the other pytest worker; 143-165 s before the resumed set-ups reused their
traces), in the module fixture: thunder interprets litgpt's GPT (rotary embeddings, grouped-query attention) for each
strategy and for the no-sync micro-batches, and inductor compiles the FSDP run's fusion regions to C++ on a cold
cache; the resumed set-ups reuse the interpreted traces (compile reuse), thunder's transforms run again.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("litgpt", reason="litgpt is in the `test` extra (pip install -e '.[test]')")

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.litgpt_scenarios import ACCUMULATION, STEPS, both


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_pool(both, str(tmp_path_factory.mktemp("litgpt")), timeout=900)


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_pretraining_order_matches_one_process(results, kind):
    ref = results[0][kind]["reference"]
    for rank, out in enumerate(results):
        r = out[kind]
        assert r["on_meta_before_setup"] is True, "init_module(empty_init=True) must leave the GPT on meta"
        assert r["decision"]["case"] == "case 1: raw module"
        if kind == "fsdp":
            assert r["executors"]["executors"] == ["sdpa", "torchcompile", "torch"], "nvFuser left out, the rest kept"
            # every torchcompile region of litgpt's GPT is called directly: none compiled twice (once refused by
            # AOTAutograd, then by Dynamo), as its attention's regions were when traced below their matmuls; and
            # most skip AOTAutograd's runtime wrapper (24 of 28 on 2026-12-06: the other 4 return views of their
            # inputs, which the wrapper regenerates)
            regions = r["direct_regions"]
            assert regions["direct"] > 0 and regions["guarded"] == 0, regions
            assert regions["straight"] > 0, regions
        else:
            assert "thunder's defaults on CPU" in r["executors"]["headline"]
        assert len(r["log"]["losses"]) == STEPS * ACCUMULATION and len(r["log"]["norms"]) == STEPS
        assert all(n > 0.3 for n in r["log"]["norms"]), "clipping never engaged"
        torch.testing.assert_close(torch.tensor(r["log"]["losses"]), torch.tensor(ref["losses"]), msg=f"rank {rank}")
        torch.testing.assert_close(torch.tensor(r["log"]["norms"]), torch.tensor(ref["norms"]), msg=f"rank {rank}")
        for name, value in ref["params"].items():
            torch.testing.assert_close(r["uninterrupted"][name], value, msg=f"rank {rank}: {name} after {STEPS} steps")


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_resumed_from_checkpoint_is_bit_equal(results, kind):
    for out in results:
        r = out[kind]
        assert r["resumed_counters"] == (STEPS * ACCUMULATION, STEPS)
        # the fresh GPT's set-up reuses both traces (syncing and accumulating): litgpt's per-module init partials
        # and its dataclass Config are keyed by content
        assert [e.startswith("reused an earlier set-up's trace") for e in r["resumed_compiles"]] == [True, True], r[
            "resumed_compiles"
        ]
        assert r["resumed_log"]["losses"] == r["log"]["losses"][len(r["log"]["losses"]) // 2 :]
        assert r["resumed"].keys() == r["uninterrupted"].keys()
        for name, value in r["uninterrupted"].items():
            assert torch.equal(r["resumed"][name], value), name

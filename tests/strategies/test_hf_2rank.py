"""A Hugging Face Llama (transformers 4.55, masks built with torch.vmap, the generation cache on by default) trains
under both strategies on 2 gloo ranks like one eager process. Needs the ``hf`` extra (in the ``test`` extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "transformers", reason="transformers is in the `hf` extra (pip install -c constraints.txt -e '.[test]')"
)

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.hf_scenarios import both


@pytest.fixture(scope="module")
def results():
    return run_on_pool(both, timeout=900)


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
def test_hf_llama_trains_like_one_process_with_its_preparations_recorded(results, kind):
    ref = results[0][kind]["reference"]
    for rank, out in enumerate(results):
        r = out[kind]
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref), atol=1e-4, rtol=0, msg=f"rank {rank}")
        assert r["use_cache"] == (True, False), "the strategy turned the generation cache off, as its decision says"
        d = r["decision"]
        assert d["case"] == "case 1: raw module"
        assert d["prepare"] == ["attention masks built by broadcasting", "use_cache turned off"]
        assert "transformers: attention masks built by broadcasting, use_cache turned off" in d["headline"]
        assert "model.config.use_cache = False" in d["reason"]

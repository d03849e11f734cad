"""Hybrid sharding on 4 real gloo ranks as a 2 x 2 mesh: one process's numbers, collectives on the right groups.

Shard groups are ranks {0, 1} and {2, 3}, replica groups {0, 2} and {1, 3}. Each reduced gradient bucket must be
all-reduced across the replicas after its reduce_scatter, and every all_gather must stay inside the shard group.

Over a minute (about 90 s beside the other pytest worker), in the module fixture: four fresh rank processes on two
cores, each compiling both hybrid levels in cases 1, 2 and 3 and the features, then DCP loads on other meshes.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.hybrid_scenarios import LEVELS, TRAINED, load_on, suite
from thunderviz.pool.spawn import run_ranks


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hybrid") / "ckpt")


@pytest.fixture(scope="module")
def plan():
    """A plan for 2 and 4 ranks on hosts of 2 (made on the meta device, without its traces; shared with the plan's
    own test of hybrid candidates, ``tests/helpers/host_plan``)."""
    from tests.helpers.host_plan import plan_across_hosts

    return plan_across_hosts()


@pytest.fixture(scope="module")
def four(ckpt_path, plan):
    """Why one 4-rank run of ~90 s: it is the only world size where both groups of a 2 x 2 mesh exist, so every
    hybrid scenario shares these 4 processes."""
    return run_ranks(suite, ckpt_path, plan, nproc=4, timeout=900)


def _close_all(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys(), what
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], msg=lambda m, name=name: f"{what}: {name}: {m}")


@pytest.mark.parametrize(("level", "case", "variant"), TRAINED)
def test_trains_like_one_process_with_collectives_on_their_groups(four, level, case, variant):
    for rank, out in enumerate(four):
        r = out[f"{level}-{case}"]
        ref = r["ref"]
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref["losses"]), msg=f"rank {rank} losses")
        _close_all(r["grads"], ref["grads"], f"rank {rank} grads")
        _close_all(r["params"], ref["params"], f"rank {rank} params after 3 steps")
        fwd, bwd = r["buckets"]["forward"], r["buckets"]["backward"]
        assert {(b["kind"], b.get("mesh_group")) for b in fwd} == {("all_gather", "shard")}
        scatters = [b for b in bwd if b["kind"] == "reduce_scatter"]
        relayed = [b for b in bwd if b["kind"] == "all_reduce"]
        assert scatters and all(b["mesh_group"] == "shard" for b in scatters)
        assert all(b["mesh_group"] == "replica" for b in relayed)
        # One replica all_reduce per reduced bucket, carrying that bucket's reduced shard (half of it on 2 ranks),
        # issued after the bucket's reduce_scatter and waited for after it.
        assert [b["label"] for b in relayed] == [b["label"] for b in scatters]
        for rs, ar in zip(scatters, relayed, strict=True):
            assert ar["bytes"] * 2 == rs["bytes"]
            assert rs["issue_index"] < rs["wait_index"] < ar["issue_index"] < ar["wait_index"]
        assert r["backward_collectives"]["all_reduce"] == len(relayed) == r["backward_collectives"]["reduce_scatter"]
        gathers_in_backward = r["backward_collectives"].get("all_gather", 0)
        assert (gathers_in_backward > 0) == (level == "HYBRID_SHARD")  # ZERO3 within the group gathers again


def test_the_auto_strategy_across_hosts_becomes_hybrid_and_trains(four, plan):
    pick = plan.recommended_for(4)
    assert pick.name == "hybrid-zero2-block"  # the least sent between hosts among those that fit
    for out in four:
        auto = out["auto"]
        assert (auto["chosen"], auto["is_fsdp"]) == ("hybrid-zero2-block", True)
        assert auto["summary"].startswith("FSDP _HYBRID_SHARD_ZERO2 mesh 2x2 BLOCK")
        assert "per host across hosts, the least of those that fit" in auto["why"]
        assert auto["mesh"].startswith("mesh 2 x 2: shard over 2 rank(s), replicate 2x")


def test_the_mesh_is_a_logged_decision(four):
    r = four[0][f"{LEVELS[0]}-raw"]
    assert "your device_mesh=(2, 2) on 4 ranks on 1 host" in r["mesh_reason"]


def test_the_ledger_names_each_collectives_group(four):
    ledger = four[0]["checkpoint"]["ledger"]
    assert {(kind, group, size) for kind, group, size, _ in ledger} == {
        ("all_gather", "shard", 2),
        ("reduce_scatter", "shard", 2),
        ("all_reduce", "replica", 2),
    }
    said = [text for kind, *_, text in ledger if kind == "all_reduce"]
    assert said and all("across replicas" in t and "(replica group of 2;" in t for t in said)


def test_no_backward_sync_accumulates_like_one_process(four):
    for out in four:
        acc = out["accumulation"]
        _close_all(acc["grads"], acc["ref_grads"], "accumulated grads")
        _close_all(acc["params"], acc["ref_params"], "params after accumulated steps")
        assert acc["refusals"]["step"] != "no error" and acc["refusals"]["clip"] != "no error"


def test_meta_init_and_activation_checkpointing_train_like_one_process(four):
    for rank, out in enumerate(four):
        meta = out["meta_init"]
        assert meta["on_meta_before_setup"]
        torch.testing.assert_close(torch.tensor(meta["losses"]), torch.tensor(meta["ref"]["losses"]))
        _close_all(meta["params"], meta["ref"]["params"], f"rank {rank} meta-init params after training")
        ckpt = out["activation_checkpointing"]
        assert ckpt["checkpointed"] == ["blocks.0", "blocks.1"]
        assert ckpt["loss"] == pytest.approx(ckpt["ref_loss"], rel=1e-5)
        _close_all(ckpt["grads"], ckpt["ref_grads"], f"rank {rank} checkpointed grads")


def test_clipping_uses_the_norm_over_both_groups(four):
    for out in four:
        c = out["checkpoint"]
        assert c["norm"] == pytest.approx(c["ref_norm"], rel=1e-5)
        _close_all(c["grads"], c["ref_grads"], "clipped grads (clip_grad_norm_ clipped the reference in place)")


def test_checkpoint_reshards_to_another_mesh_and_world(four, ckpt_path):
    saved = four[0]["checkpoint"]["saved"]
    results = {"4 ranks, 4 x 1 mesh": [o["checkpoint"]["loaded_4x1"] for o in four]}
    results["2 ranks, FSDP"] = run_on_pool(load_on, ckpt_path, timeout=600)
    results["1 rank"] = run_ranks(load_on, ckpt_path, nproc=1, timeout=600)
    for where, per_rank in results.items():
        for got in per_rank:
            _close_all(got["params"], saved["params"], f"{where} params")
            for name, state in saved["optimizer"].items():
                _close_all(got["optimizer"][name], state, f"{where} optimizer {name}")

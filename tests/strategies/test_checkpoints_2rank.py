"""Checkpoints on real gloo ranks: saved by 2 ranks, loaded by 2, 1 and 3 ranks and by plain one-process torch.

Resumed training must be bit-equal to uninterrupted training (same world size); loading at another world size
must restore exactly the saved model and optimizer state; every invalid setting raises with the fix.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.rank_pool import run_on_pool
from tests.strategies.checkpoint_scenarios import (
    FORMATS,
    KINDS,
    OPTIMIZERS,
    CkptNet,
    load_elsewhere,
    two_rank_suite,
)
from thunderviz.pool.spawn import run_ranks

COMBOS = [f"{k}-{f}-{o}" for k in KINDS for f in FORMATS for o in OPTIMIZERS]
SHARDED = [f"{k}-sharded-{o}" for k in KINDS for o in OPTIMIZERS]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def two(ckpt_dir):
    return run_on_pool(two_rank_suite, str(ckpt_dir), timeout=900)


@pytest.fixture(scope="module")
def converted(two, ckpt_dir):
    """The documented one-line conversion of each sharded checkpoint to one file, in this (non-distributed) process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = {}
    for name in SHARDED:
        dcp_to_torch_save(ckpt_dir / name, ckpt_dir / f"{name}.pt")
        out[name] = str(ckpt_dir / f"{name}.pt")
    return out


@pytest.fixture(scope="module")
def one_rank(two, converted, ckpt_dir):
    return run_ranks(load_elsewhere, str(ckpt_dir), converted, nproc=1, timeout=600)


@pytest.fixture(scope="module")
def three_ranks(two, ckpt_dir):
    return run_ranks(load_elsewhere, str(ckpt_dir), {}, nproc=3, timeout=600)


def _assert_equal(got, expected, what):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape, what
        assert torch.equal(got, expected), what
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), what
        for k in expected:
            _assert_equal(got[k], expected[k], f"{what}.{k}")
    else:
        assert got == expected, what


@pytest.mark.parametrize("combo", COMBOS)
def test_resumed_training_is_bit_equal_to_uninterrupted(two, combo):
    for rank, out in enumerate(two):
        r = out[combo]
        _assert_equal(r["loaded"], r["saved"], f"rank {rank} loaded state")
        _assert_equal(r["resumed"], r["uninterrupted"], f"rank {rank} params after resuming")
        assert r["step"] == 2
        assert r["remainder"] == {"note": {"text": "hello", "lr": [0.1]}}
        assert r["siblings"] == [], "a temporary sibling was left behind"
        if "sharded" in combo:
            assert r["on_disk"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "thunderviz.json"]
        else:
            assert r["on_disk"] == "file"


@pytest.mark.parametrize("kind", KINDS)
def test_full_checkpoint_is_one_plain_torch_file(two, ckpt_dir, kind):
    saved = two[0][f"{kind}-full-adamw"]["saved"]
    ckpt = torch.load(ckpt_dir / f"{kind}-full-adamw", weights_only=True)
    assert sorted(ckpt) == ["model", "note", "optimizer", "step"]
    plain = CkptNet()
    plain.load_state_dict(ckpt["model"])
    _assert_equal({n: p.detach() for n, p in plain.named_parameters()}, saved["params"], "model")
    optimizer = torch.optim.AdamW(plain.parameters(), lr=0.01, weight_decay=0.1)
    optimizer.load_state_dict(ckpt["optimizer"])  # torch's own indexing, full-size state
    names = [n for n, _ in plain.named_parameters()]
    for i, p in enumerate(plain.parameters()):
        _assert_equal(dict(optimizer.state[p]), saved["optimizer"][names[i]], f"optimizer state of {names[i]}")


@pytest.mark.parametrize("name", SHARDED)
def test_sharded_checkpoint_loads_in_one_plain_process(two, ckpt_dir, converted, name):
    """No process group, no thunderviz: DCP reads the pieces into full tensors; the converted file is plain."""
    import torch.distributed.checkpoint as dcp

    saved = two[0][name]["saved"]
    sd = {"model": CkptNet().state_dict()}
    with pytest.warns(UserWarning, match="assuming the intent is to load in a single process"):
        dcp.load(sd, checkpoint_id=ckpt_dir / name)
    _assert_equal(sd["model"], saved["params"], "model loaded by DCP in one process")
    one_file = torch.load(converted[name], weights_only=True)
    assert sorted(one_file) == ["model", "note", "optimizer", "step"]
    _assert_equal(one_file["model"], saved["params"], "model in the converted file")
    assert sorted(one_file["optimizer"]["state"]) == sorted(saved["optimizer"])


@pytest.mark.parametrize("name", SHARDED)
def test_sharded_checkpoint_loads_on_one_and_three_ranks(two, one_rank, three_ranks, name):
    saved = two[0][name]["saved"]
    for world, results in ((1, one_rank), (3, three_ranks)):
        for rank, out in enumerate(results):
            _assert_equal(out[name], saved, f"world {world}, rank {rank}")


@pytest.mark.parametrize("name", SHARDED)
def test_converted_file_loads_through_fabric(two, one_rank, name):
    saved = two[0][name]["saved"]
    got = one_rank[0][f"{name}-converted"]
    _assert_equal({"params": got["params"], "optimizer": got["optimizer"]}, saved, "converted file")
    assert got["remainder"] == {"step": 2, "note": {"text": "hello", "lr": [0.1]}}


def test_load_raw_of_a_plain_state_dict_with_either_setting(two):
    for out in two:
        r = out["load_raw"]
        for kind in KINDS:
            for sdt in FORMATS:
                _assert_equal(r[f"{kind}-{sdt}"]["params"], r["expected"], f"{kind}-{sdt} params")
                _assert_equal(r[f"{kind}-{sdt}"]["exp_avg"], r["expected_exp_avg"], f"{kind}-{sdt} exp_avg")


def test_invalid_settings_raise_with_the_fix(two, ckpt_dir):
    tmp = ckpt_dir / "errors"
    for out in two:
        e = out["errors"]
        assert e["sharded_to_file"] == (
            f"ValueError: `fabric.save('{tmp}/a_file.txt', ...)`: the path is a file, but"
            " ThunderFSDPStrategy(state_dict_type='sharded') writes a directory (PyTorch Distributed Checkpoint)."
            " Choose another path, remove the file, or set `state_dict_type='full'` to write one file."
        )
        assert e["sharded_to_other_dir"] == (
            f"ValueError: `fabric.save('{tmp}/a_dir', ...)`: the path is a directory that is not a checkpoint, and"
            " saving would replace everything in it. Choose a new path (or remove the directory yourself)."
        )
        assert e["full_to_dir"] == (
            f"ValueError: `fabric.save('{tmp}/good', ...)`: the path is a directory, but"
            " ThunderFSDPStrategy(state_dict_type='full') writes one file. Choose a file path, or set"
            " `state_dict_type='sharded'` to write a PyTorch Distributed Checkpoint directory."
        )
        assert e["no_model"] == (
            "ValueError: `fabric.save(path, state)` got a state with no model set up by ThunderFSDPStrategy (keys:"
            " ['optimizer', 'step']). A checkpoint holds one model and what belongs to it: pass the object"
            " `fabric.setup` returned, e.g. `fabric.save(path, {'model': model, 'optimizer': optimizer})`."
        )
        assert e["two_models"] == (
            "ValueError: `fabric.save(path, state)` got a state with 2 models set up by ThunderFSDPStrategy"
            " ('model', 'ema'); a checkpoint holds one model (its optimizer state is matched to that model's"
            " parameter names). Save each model, with its own optimizer, to its own path."
        )
        assert e["load_empty"].startswith(
            f"ValueError: `fabric.load('{tmp}/good', state)` got state={{}}, but a sharded checkpoint is loaded into"
            " the objects it restores. Pass them: `fabric.load(path, {'model': model, 'optimizer': optimizer})`."
        )
        assert "dcp_to_torch_save(path, 'full.pt')" in e["load_empty"]
        assert e["load_none"].startswith(f"ValueError: `fabric.load('{tmp}/good', state)` got state=None")
        assert e["load_unknown_key"] == (
            f"ValueError: `fabric.load('{tmp}/good', state)`: the checkpoint has no 'scheduler' (it holds"
            " 'model', 'optimizer', 'step'). Remove them from `state`, or pass `strict=False` to load only what"
            " is there."
        )
        assert e["load_unknown_key_not_strict"] == {"step": 1}  # what the checkpoint holds beyond `state`
        assert e["load_raw_of_directory"].startswith(
            f"ValueError: `fabric.load_raw('{tmp}/good', CkptNet)` reads one file holding a plain state dict, but"
            " this is a sharded checkpoint directory."
        )
        assert e["load_missing_path"] == (
            f"FileNotFoundError: `fabric.load('{tmp}/nothing', ...)`: no checkpoint at this path."
        )
        assert e["load_full_empty"].startswith(
            f"ValueError: `fabric.load('{tmp}/good.pt', state={{}})` asks to restore nothing."
        )
        assert e["load_full_none"] == ["model", "step"]
        assert e["load_wrong_shape"] == (
            f"ValueError: `fabric.load('{tmp}/good', state)`: model.fc1.weight is (7, 6) in the checkpoint but (9, 6)"
            " here. Load a checkpoint of this model and optimizer (same configuration); the world size may differ."
        )
        for failing in ("failing_sharded_save", "failing_full_save", "fresh_failing_save"):
            assert e[failing] != "no error"
            assert "pickle" in e[failing].lower() or "rank 0" in e[failing], e[failing]
        assert e["still_loads"] is True
        assert e["leftovers"] == ["a_dir", "a_file.txt", "good", "good.pt"], "a failed save left something behind"

"""The bucket plan, as plain data: which parameters share a collective, and in which order DDP buckets close."""

from __future__ import annotations

import pytest
from torch import nn

from thunderviz.demos.models import TinyGPT
from thunderviz.parallel.buckets import bucket_label, find_blocks, group_in_order, size_capped
from thunderviz.trace.buckets import ROOT_LABEL


def test_blocks_of_a_gpt_are_the_children_of_its_block_list():
    assert find_blocks(TinyGPT(n_layer=3, d_model=8, n_head=2)) == ["blocks.0", "blocks.1", "blocks.2"]


def test_outermost_repeated_container_wins_and_mixed_sequentials_are_layers():
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))  # repeated, but inside a block

    model = nn.Module()
    model.stem = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))  # mixed classes: not blocks
    model.stages = nn.Sequential(Inner(), Inner())
    model.head = nn.Linear(2, 1)
    assert find_blocks(model) == ["stages.0", "stages.1"]


def test_a_container_of_parameterless_modules_is_not_a_block_list():
    model = nn.Module()
    model.acts = nn.ModuleList([nn.ReLU(), nn.ReLU()])
    model.fc = nn.Linear(2, 2)
    assert find_blocks(model) == []


def test_a_top_level_sequential_of_equal_layers_is_itself_the_block_list():
    assert find_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == ["0", "1"]


@pytest.mark.parametrize(
    ("name", "bucketing", "expected"),
    [
        ("blocks.1.attn_qkv.weight", "NONE", "blocks.1.attn_qkv.weight"),
        ("blocks.1.attn_qkv.weight", "LAYER", "blocks.1.attn_qkv"),
        ("blocks.1.attn_qkv.weight", "BLOCK", "blocks.1"),
        ("blocks.10.ln_1.bias", "BLOCK", "blocks.10"),  # not blocks.1: prefixes end at a dot
        ("wte.weight", "BLOCK", ROOT_LABEL),
        ("wte.weight", "LAYER", "wte"),
        ("scale", "LAYER", ROOT_LABEL),  # owned by the set-up module itself
    ],
)
def test_bucket_labels(name, bucketing, expected):
    blocks = [f"blocks.{i}" for i in range(11)]
    assert bucket_label(name, bucketing, blocks) == expected


def test_unknown_bucketing_names_the_choices():
    with pytest.raises(ValueError, match="NONE, LAYER, BLOCK"):
        bucket_label("w", "PER_MODEL")


def test_group_in_order_keeps_first_appearance_order():
    assert group_in_order([("b", 1), ("a", 2), ("b", 3)]) == [("b", [1, 3]), ("a", [2])]


def test_size_capped_closes_a_bucket_once_it_reaches_the_cap():
    sizes = [("f32", 4), ("f32", 4), ("f32", 4), ("f32", 1)]
    assert size_capped(sizes, cap_bytes=8) == [[0, 1], [2, 3]]


def test_size_capped_zero_cap_is_one_bucket_per_gradient():
    assert size_capped([("f32", 4)] * 3, cap_bytes=0, first_cap_bytes=100) == [[0], [1], [2]]


def test_size_capped_first_bucket_is_smaller_like_torch_ddp():
    assert size_capped([("f32", 4)] * 5, cap_bytes=100, first_cap_bytes=4) == [[0], [1, 2, 3, 4]]


def test_size_capped_never_mixes_dtypes_and_orders_by_last_ready_member():
    sizes = [("f32", 4), ("bf16", 2), ("f32", 4), ("bf16", 2)]
    assert size_capped(sizes, cap_bytes=100) == [[0, 2], [1, 3]]


def test_comm_config_is_plain_data():
    from thunderviz.parallel.buckets import CommConfig

    c = CommConfig(param_name="blocks.0.w", owner="Net", owner_id=1, parallelism="fsdp", label="blocks.0")
    assert c.reshard_after_forward is False and c.bucket_cap_bytes == 0

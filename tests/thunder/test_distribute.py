"""The shard layout (torch.chunk's split along dim 0, padded to equal length), without processes."""

from __future__ import annotations

import pytest
import torch

from thunderviz.thunder.comm import distribute


@pytest.mark.parametrize(("rows", "world", "padding"), [(7, 2, 1), (8, 2, 0), (1, 2, 1), (5, 4, 3)])
def test_shards_cover_the_tensor_and_pad_the_last(rows, world, padding):
    t = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    shards = [distribute.shard_tensor(t, r, world) for r in range(world)]
    assert {p for _, p in shards} == {padding}
    assert len({s.shape for s, _ in shards}) == 1
    torch.testing.assert_close(torch.cat([s for s, _ in shards])[:rows], t)
    assert torch.count_nonzero(torch.cat([s for s, _ in shards])[rows:]) == 0


@pytest.mark.parametrize(("rows", "world"), [(7, 2), (1, 2), (5, 4), (8, 3)])
def test_real_rows_are_torch_chunk_pieces(rows, world):
    """What DCP's Shard(0) expects on each rank (DTensor uses torch.chunk), so checkpoints can describe shards."""
    t = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    chunks = list(torch.chunk(t, world)) + [t[:0]] * world
    for rank in range(world):
        shard, _ = distribute.shard_tensor(t, rank, world)
        chunk = (rows + world - 1) // world
        real = max(0, min(rows, chunk * (rank + 1)) - chunk * rank)
        torch.testing.assert_close(shard[:real], chunks[rank])
        assert torch.count_nonzero(shard[real:]) == 0

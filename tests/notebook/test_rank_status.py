"""``RankStatus`` as the magics drive it: exactly the pool's ranks, the engine's phases, a static picture after."""

from __future__ import annotations

import pytest

from thunderviz.cell.status import PHASES
from thunderviz.notebook.widgets import RankStatus


def test_states_are_the_engines_phases() -> None:
    assert RankStatus.STATES == PHASES
    status = RankStatus(1)
    for phase in PHASES:
        status.set_status(0, phase)
    with pytest.raises(ValueError, match="use one of"):
        status.show({0: "collected"})


def test_show_follows_the_pool_size_and_keeps_unchanged_chips() -> None:
    status = RankStatus(2, label="%%thunder_fsdp")
    status.show({0: "starting", 1: "starting"})
    before = status.ranks[1]
    status.show({0: "running", 1: "starting", 2: "starting", 3: "starting"})  # the attached pool was larger
    assert [r["state"] for r in status.ranks] == ["running", "starting", "starting", "starting"]
    assert status.ranks[1] == before  # the same chip: its seconds did not move
    status.show({0: "done"})
    assert repr(status) == "RankStatus(0:done)"
    with pytest.raises(ValueError, match=r"every rank 0\.\.N-1"):
        status.show({1: "done"})


def test_static_bundle_reads_without_a_kernel_and_escapes() -> None:
    status = RankStatus(2, label="<i>cell</i>")
    status.show({0: "done", 1: "failed"})
    bundle = status.static_bundle()
    assert bundle["text/plain"] == "ranks: 0:done  1:failed"
    assert "&lt;i&gt;cell&lt;/i&gt;" in bundle["text/html"] and "<i>" not in bundle["text/html"]
    assert "rank 1: failed" in bundle["text/html"] and "<script" not in bundle["text/html"]
    assert set(bundle) == {"text/plain", "text/html"}

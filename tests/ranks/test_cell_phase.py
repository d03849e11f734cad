"""The rank's "compiling" sub-phase (a first compile showed as a bare "running" for 12 s): the watch
samples the main thread's stack during a real thunder compile, in this process, and says so."""

from __future__ import annotations

import time

import thunder
import torch

from thunderviz.cell.protocol import PHASE_DATA_KEY
from thunderviz.cell.status import Phase
from thunderviz.rank.cell_phase import INTERPRETER, PASSES, CellPhaseWatch, compile_split


def test_the_watch_says_compiling_during_a_thunder_compile_and_running_after_it() -> None:
    said: list[dict] = []
    watch = CellPhaseWatch(said.append, sample_s=0.01)
    model = thunder.jit(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)))
    x = torch.randn(2, 8, requires_grad=True)
    watch.start()
    model(x).sum().backward()  # the first call compiles forward and backward
    watch.stop()
    assert [d[PHASE_DATA_KEY] for d in said] == [Phase.COMPILING, Phase.RUNNING]
    # the same samples say where the compile's time went: the interpreter, then thunder's passes after it
    assert watch.spent.get(INTERPRETER, 0) > 0 and watch.spent.get(PASSES, 0) > 0, watch.spent
    line = compile_split(watch.spent, total_s=sum(watch.spent.values()) + 1.0)
    assert line.startswith("of this rank's ") and "thunder's interpreter" in line, line
    assert "the rest (the cell's own code and steps) 1.0 s" in line, line
    # the same call again runs from thunder's cache: nothing compiles, nothing is said
    said.clear()
    watch.start()
    for _ in range(3):
        model(x).sum().backward()
    time.sleep(0.05)
    watch.stop()
    assert said == [] and watch.spent == {}
    assert compile_split(watch.spent) == ""  # nothing compiled: nothing to split
    assert (
        compile_split(watch.spent, total_s=1.0)
        == "of this rank's 1.0 s: the rest (the cell's own code and steps) 1.0 s"
    )

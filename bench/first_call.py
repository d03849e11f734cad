"""CPU time of a model's first call under thunder.jit (forward and backward, one process): thunder's own paths
against thunderviz's shortcuts through its interpreter and passes (``thunder.jit.shortcuts``).

A 2-block litgpt ``GPT`` with random weights; each round compiles afresh (a new ``thunder.jit``), the two ways in
turns, so a noisy machine slows each alike. Printed: every round's CPU seconds per way and the second-best's ratio to
thunder's paths. Run: ``.venv/bin/python bench/first_call.py [rounds]``.
"""

from __future__ import annotations

import contextlib
import sys
import time


def main() -> None:
    import thunder
    import torch
    from litgpt import GPT, Config

    from thunderviz.thunder.jit import shortcuts

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    shortcuts.install()
    torch.manual_seed(0)
    model = GPT(Config(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=128, padded_vocab_size=128))
    x = torch.randint(0, 128, (2, 32))

    def first_call(paths: contextlib.AbstractContextManager) -> float:
        with paths:
            jitted = thunder.jit(model)
            start = time.process_time()
            jitted(x).sum().backward()
            return time.process_time() - start

    first_call(contextlib.nullcontext())  # imports and one-time set-up out of the way
    ways = {"thunder's paths": shortcuts.suspended, "shortcuts": contextlib.nullcontext}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, paths in ways.items():
            seconds[name].append(first_call(paths()))
    base = sorted(seconds["thunder's paths"])[1]
    for name, got in seconds.items():
        got = sorted(got)
        rounds_s = " ".join(f"{t:.2f}" for t in got)
        print(f"{name:16} CPU s per first call: {rounds_s}; second-best {got[1]:.2f} s = {got[1] / base:.2f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The GPU path in one go: ThunderDDPStrategy and ThunderFSDPStrategy on NCCL with world size 1, traces
# captured on CUDA, bucketing on, thunder's nvFuser executor when installed, %%thunder_fsdp --nproc 1 in a real
# Jupyter kernel, and the memory plan's predicted step peak against CUDA's max_memory_allocated (within 10%), and our strategies' step
# time and peak against eager's with the executors the strategy decides (gates: <= 1.10x, ZERO3 <= 1.20x, and <= 1.0x). Prints what ran;
# exit 0 only when every check passed. Needs one CUDA GPU and finishes in < 6 min.
#   bench/device_check.sh                  # on a GPU machine
#   bench/device_check.sh --cpu-rehearsal  # the same steps on CPU with gloo (what the test suite runs)
# PYTHON=... picks the interpreter (default: the repository's .venv, else python3).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$here/.venv/bin/python" ]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
cd "$here"
timeout --kill-after=10 355 "$py" bench/device_check.py "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "device_check: did not finish within 355 s (the bound is 6 minutes); see the steps printed above." >&2
fi
exit "$rc"

"""Running code in a real Jupyter kernel (jupyter_client) and reading back what the cell printed and its reply.

Shared by the kernel tests and the benches that drive a kernel (``bench/soak.py``, ``bench/device_check.py``), so
they all read messages the same way: only those answering this request (a slow kernel may still be answering an
earlier ``kernel_info``), every wait bounded by one deadline.
"""

from __future__ import annotations

import queue
import time
from typing import Any

__all__ = ["execute", "reply_to", "wait_for_output"]


def execute(kc: Any, code: str, timeout: float = 240) -> tuple[dict[str, Any], str]:
    """Run ``code``; return the shell reply's content and the text it printed (streams and tracebacks).

    Raises ``queue.Empty`` when the kernel stays silent past ``timeout`` seconds.
    """
    msg_id = kc.execute(code)
    text: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            text.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return reply_to(kc, msg_id, timeout=max(1.0, deadline - time.monotonic()))["content"], "".join(text)


def reply_to(kc: Any, msg_id: str, timeout: float = 30) -> dict[str, Any]:
    """The shell reply to ``msg_id``; skips stray replies (``wait_for_ready`` may send several kernel_info requests
    to a slow kernel and read only one answer)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def wait_for_output(kc: Any, msg_id: str, needles: list[str], timeout: float = 60) -> str:
    """Read what the running request ``msg_id`` prints until every one of ``needles`` appeared; returns the text.

    Why: a test that must act while a cell runs (interrupt it) waits for the cell to say it runs, instead of
    sleeping a fixed time that is too short on a loaded machine and wasted on an idle one.

    Raises:
        AssertionError: the request went idle, or ``timeout`` seconds passed, before every needle was printed.
    """
    text: list[str] = []
    deadline = time.monotonic() + timeout
    while not all(needle in "".join(text) for needle in needles):
        left = deadline - time.monotonic()
        assert left > 0, f"within {timeout:.0f} s the cell printed {''.join(text)!r}, without all of {needles!r}"
        try:
            msg = kc.get_iopub_msg(timeout=min(1.0, left))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            raise AssertionError(f"the cell ended before printing all of {needles!r}: {''.join(text)!r}")
    return "".join(text)

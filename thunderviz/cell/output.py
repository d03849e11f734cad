"""What of a rank's output reaches the cell: everything the user's code prints, not the libraries' chatter.

gloo prints ``[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1`` from C++
whenever a process group forms, and torch warns ``Deallocating Tensor that still has live PyObject references``
when thunder frees a tensor it took a weak reference to: neither is about the user's code, and in a notebook they
read as errors. Such lines go to the ``thunderviz.ranks.output`` logger at DEBUG instead (turn it on with
``logging.getLogger("thunderviz.ranks.output").setLevel(logging.DEBUG)`` and a handler) and stay in the report's
``outputs``, like everything else the rank printed.
"""

from __future__ import annotations

import logging
import re

__all__ = ["CHATTER", "LOG", "is_chatter"]

#: Lines of library chatter, by what they say (matched anywhere in the line: the rank prefix varies).
CHATTER = (
    re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
    re.compile(r"Deallocating Tensor that still has live PyObject references"),
)
#: Where the chatter goes instead of the cell.
LOG = logging.getLogger("thunderviz.ranks.output")


def is_chatter(line: str) -> bool:
    """Whether ``line`` is library chatter (``CHATTER``) rather than the user's output."""
    return any(p.search(line) for p in CHATTER)

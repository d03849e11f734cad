"""Debian's Chromium as every browser test and bench launches it (never a downloaded browser).

One place for the path and the flags: no sandbox (CI runs as root), no GPU, no background traffic or updates (the
pages must work offline), ``/tmp`` instead of a small ``/dev/shm`` in containers.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "MISSING_REASON", "chromium_missing"]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
MISSING_REASON = f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)"


def chromium_missing() -> bool:
    """True where Debian's Chromium is not installed (the browser tests skip, the benches skip their browser part)."""
    return not Path(CHROMIUM).exists()

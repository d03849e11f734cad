"""A real JupyterLab on 127.0.0.1 driven by Debian's Chromium: the browser tests and the docs' screenshots share it.

One server per use (a random port, a token, its own config, runtime, workspace and settings folders under the
notebook's folder, so nothing of the user's JupyterLab is read or written), one page, and every console error,
page error and dialog collected for the caller to assert on. Jupyter's news and update checks are off: the pages
must work offline and nothing may cover the widgets.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS

__all__ = ["LabPage", "open_lab", "run_all", "wait_until_idle"]


@dataclass
class LabPage:
    """The page showing the notebook, and what went wrong in it (console errors, page errors, dialogs)."""

    page: Any
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _free_port() -> int:
    from thunderviz.pool.rendezvous import free_port

    return free_port()


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"jupyter lab did not answer {url} in {timeout} s:\n{log.read_text()[-3000:]}")


def _lab_command(root: Path, port: int, token: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.workspaces_dir={root / '.ws'}",
        f"--LabApp.user_settings_dir={root / '.settings'}",
        "--LabApp.extension_manager=readonly",
    ]
    if os.geteuid() == 0:  # CI containers run as root; the server refuses without this
        cmd.append("--allow-root")
    return cmd


@contextmanager
def open_lab(
    notebook: Path,
    env: dict[str, str] | None = None,
    viewport: tuple[int, int] = (1500, 1400),
    init_scripts: Sequence[str] = (),
) -> Iterator[LabPage]:
    """Serve ``notebook``'s folder with JupyterLab and open the notebook in headless Chromium, its kernel idle.

    ``env`` is added to the server's environment (the kernel inherits it); ``init_scripts`` run in the page before
    JupyterLab's own (observers a test reads later). The server is stopped, by its pid, when the block ends, also
    when it raises.
    """
    from playwright.sync_api import sync_playwright

    root = notebook.parent
    port, token = _free_port(), secrets.token_hex(16)
    server_env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(root / ".cfg"),
        JUPYTER_RUNTIME_DIR=str(root / ".runtime"),
        PYTHONWARNINGS="ignore::DeprecationWarning",
        **(env or {}),
    )
    # No "get notified about Jupyter news?" toast over the widgets (and no fetch of news from the network).
    notif = root / ".settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True, exist_ok=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    log = root / "lab.log"
    t0 = time.monotonic()
    with open(log, "w") as logf:
        server = subprocess.Popen(
            _lab_command(root, port, token), stdout=logf, stderr=subprocess.STDOUT, env=server_env, cwd=root
        )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", server, log)
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(root / ".chromium"),
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": viewport[0], "height": viewport[1]},
            )
            try:
                page = ctx.pages[0] if ctx.pages else ctx.new_page()
                lab = LabPage(page, timings={"server_s": time.monotonic() - t0})
                page.on(
                    "console", lambda m: lab.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None
                )
                page.on("pageerror", lambda e: lab.errors.append(f"pageerror: {e}"))
                page.on("dialog", lambda d: (lab.errors.append(f"dialog: {d.message}"), d.dismiss()))
                for script in init_scripts:
                    page.add_init_script(script)
                t1 = time.monotonic()
                page.goto(f"http://127.0.0.1:{port}/lab/tree/{notebook.name}?token={token}")
                # The kernel status in the status bar reads "Python 3 (ipykernel) | Idle" once the kernel is up.
                page.wait_for_function(
                    "(document.querySelector('#jp-main-statusbar') || {}).textContent?.includes('| Idle')",
                    timeout=90_000,
                )
                lab.timings["lab_open_s"] = time.monotonic() - t1
                yield lab
            finally:
                ctx.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)


def run_all(lab: LabPage) -> None:
    """Run every cell (JupyterLab's own "Run All" command); returns at once, the cells run in the kernel."""
    lab.page.evaluate("window.jupyterapp.commands.execute('runmenu:run-all')")


def wait_until_idle(lab: LabPage, timeout_s: float) -> None:
    """Wait until no cell is queued or running (JupyterLab marks such cells' prompts with ``[*]``)."""
    lab.page.wait_for_function(
        "![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'))"
        " && (document.querySelector('#jp-main-statusbar') || {}).textContent?.includes('| Idle')",
        timeout=timeout_s * 1000,
    )

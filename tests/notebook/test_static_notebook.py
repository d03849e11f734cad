"""Static representation: a notebook with a trace widget, run by a real kernel and exported by nbconvert, shows
the graph without any widget state or JavaScript (what GitHub and nbconvert HTML readers see)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from tests.helpers.trace_scenarios import two_rank_run
from thunderviz.render.graph import dot_available

pytestmark = pytest.mark.timeout(300)


def test_nbconvert_html_shows_the_graph_without_widget_state(tmp_path) -> None:
    path = two_rank_run()[0].path
    nb = nbformat.v4.new_notebook()
    nb.cells.append(
        nbformat.v4.new_code_cell(
            f"from thunderviz.notebook.widgets import TraceView\nTraceView({path!r}, name='gpt-fsdp', trace='backward')"
        )
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    # Saved without widget state, as this project commits notebooks (state adds megabytes).
    NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        store_widget_state=False,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    out = nb.cells[0].outputs
    assert [o["output_type"] for o in out] == ["execute_result"], out
    data = out[0]["data"]
    assert set(data) == {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"}
    assert data["text/plain"].startswith("TraceView('gpt-fsdp', trace='backward': ")
    assert "application/vnd.jupyter.widget-state+json" not in nb.metadata.get("widgets", {})
    page, _ = HTMLExporter().from_notebook_node(nb)
    # Without widget state nbconvert falls back to our text/html: the graph itself, not an empty widget box.
    assert "gpt-fsdp" in page and "reduce_scatter" in page
    if dot_available():
        assert page.count("<svg") >= 1 and 'class="node"' in page
    else:
        assert "digraph trace" in page

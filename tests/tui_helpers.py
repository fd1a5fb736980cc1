"""Small helpers shared by the TUI pilot tests."""

from __future__ import annotations

import pytest
from textual.widgets import Static


def text_of(app, selector: str) -> str:
    """The plain text a Static on the current screen shows."""
    c = app.screen.query_one(selector, Static).content
    return c.plain if hasattr(c, "plain") else str(c)


@pytest.fixture(autouse=True)
def no_hf_cache(tmp_path, monkeypatch):
    """The model picker must not see this machine's Hugging Face cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))

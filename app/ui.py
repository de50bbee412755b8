"""Gradio page (placeholder until the full UI lands)."""

from __future__ import annotations

from typing import Any


def mount_ui(app: Any, config: Any) -> Any:
    return app

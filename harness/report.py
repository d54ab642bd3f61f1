"""A benchmark script's Markdown: printed, and written to ``--output`` when one is given."""

from __future__ import annotations

from pathlib import Path


def emit(text: str, output: str | None = None) -> None:
    """Print ``text``; also write it, newline-terminated, to ``output`` when one is given."""
    print(text)
    if output:
        Path(output).write_text(text + "\n")

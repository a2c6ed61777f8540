"""transformers' progress bars off while specdec loads or converts a model."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own bars ("Loading weights") off while a model loads: a library does not draw
    on its caller's terminal (the CLI shows its own spinner)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()

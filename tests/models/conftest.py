"""The kernel tests run the kernels' threaded split: two intra-op threads, whatever the suite's
default (one, tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)

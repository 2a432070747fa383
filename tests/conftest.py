"""Shared fixtures and the hypothesis profile for the test suite."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "funcprune",
    max_examples=int(os.environ.get("FUNCPRUNE_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("funcprune")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def generator() -> torch.Generator:
    """A freshly seeded CPU generator."""
    return torch.Generator().manual_seed(1234)

"""The hypothesis profiles and torch's thread count for the test suite.

Two profiles, both derandomized (the same examples every run):

- ``dev`` (the default): 60 examples per property, so that the whole suite
  runs in a few minutes or less on 2 cores;
- ``ci``: 300 examples per property, selected when the environment variable
  ``CI`` is set (CI runs with ``CI=true``) or ``FUNCPRUNE_PROFILE=ci``.

``FUNCPRUNE_EXAMPLES=N`` overrides the number of examples of either.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

_EXAMPLES = {"dev": 60, "ci": 300}

for _name, _examples in _EXAMPLES.items():
    settings.register_profile(
        _name,
        max_examples=int(os.environ.get("FUNCPRUNE_EXAMPLES", _examples)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=True,
    )
_default = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("FUNCPRUNE_PROFILE", _default))
torch.set_num_threads(min(2, torch.get_num_threads()))

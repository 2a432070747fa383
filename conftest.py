"""What every test, doctest and docs example needs before anything imports torchvision.

torchvision 0.28's wheel (the one built for torch 2.13.0, pinned in
``constraints.txt``) registers meta kernels for its C ops when it is
imported, and those C ops do not load beside torch's CPU wheel
("operator torchvision::nms does not exist"). transformers imports
torchvision when it is installed, so the one module that registers them is
stubbed here: torchvision's models (all the tests use) import and run
without their C ops, which only detection models need.
"""

from __future__ import annotations

import sys
import types

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

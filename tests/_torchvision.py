"""torchvision, importable beside the CPU torch wheel: import this module before anything imports torchvision.

torchvision 0.28's wheel (the one built for torch 2.13.0, pinned in
``constraints.txt``) registers meta kernels for its C ops when it is
imported, and those C ops do not load beside torch's CPU wheel
("operator torchvision::nms does not exist"). transformers and Lightning
import torchvision when it is installed. The module that registers the
kernels is stubbed: torchvision's models import and run without their C ops
(only detection models need them). The repository's ``conftest.py`` does the
same for the test process; processes the tests start (the distributed
workers, subprocesses) import this module first.
"""

from __future__ import annotations

import sys
import types

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

"""``python -m funcprune``: the demo on scikit-learn's digits, and the pruning tutorial (the door).

``_run.py`` runs the demo's tables and figure, ``_digits.py`` holds its data
and CNN, ``_tutorial.py`` the PyTorch pruning tutorial's steps as plans and
in hook mode; ``_parser.py`` its command line (``parse``, ``run``), shared by
``python -m funcprune`` and ``funcprune demo``. It uses only the other rooms' doors, as a user would.
"""

from ._parser import DESCRIPTION as DESCRIPTION
from ._parser import parse as parse
from ._parser import run as run
from ._run import main as main

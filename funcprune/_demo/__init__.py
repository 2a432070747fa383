"""``python -m funcprune``: the demo on scikit-learn's digits, and the pruning tutorial (the door).

``_run.py`` runs the demo's tables and figure, ``_digits.py`` holds its data
and CNN, ``_tutorial.py`` the PyTorch pruning tutorial's steps as plans and
in hook mode. It uses only the other rooms' doors, as a user would.
"""

from ._run import main as main

"""``python -m funcprune``: the demo (see funcprune._demo); ``--help`` says what it does."""

from __future__ import annotations

import argparse

from ._demo import main

_DESCRIPTION = """\
Run funcprune's demo: the PyTorch pruning tutorial done functionally (specs,
plans, mask dicts), the same masks as torch.nn.utils.prune, global pruning,
a custom spec, iterative magnitude pruning in a functional training loop on
synthetic data, and one vmapped call pruning an ensemble. It prints as it
goes and takes about 10 seconds on 2 CPU cores. See README.md for the API.
"""


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m funcprune", description=_DESCRIPTION)
    return parser.parse_args(argv)


if __name__ == "__main__":
    _parse()
    main()

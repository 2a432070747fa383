"""The demo's command line: ``python -m funcprune`` and ``funcprune demo`` parse their flags here."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._run import main

__all__ = ["DESCRIPTION", "parse", "run"]

DESCRIPTION = """\
Run funcprune's demo on scikit-learn's handwritten digits (8x8 images shipped
with scikit-learn, split 75/25 with a fixed seed; without scikit-learn it
falls back to synthetic digits and says so). It trains a small CNN densely,
then prints tables of: gradual (cubic) magnitude pruning to 95% weight
sparsity while training; iterative magnitude pruning with rewinding (the
lottery ticket) against random masks at the same sparsities; test accuracy
against sparsity; ERK against uniform allocation; an ensemble of 4 CNNs with
their own masks trained in one vmap(grad(...)); and the PyTorch pruning
tutorial's steps as plans and in hook mode with funcprune.compat, checked to
give torch.nn.utils.prune's masks; and at last half the channels of the CNN
pruned across layers (global_structured), fine-tuned and shrunk (shrink) to
a smaller, faster model with the same accuracy. It saves the accuracy-against-sparsity
curves and per-layer sparsities as a PNG (with matplotlib). Install the
extras with: pip install ".[demo]". About a minute on 2 CPU cores (--quick:
about 20 seconds). See README.md and docs/ for the API.
"""


def parse(argv: Sequence[str] | None = None, *, prog: str = "python -m funcprune") -> argparse.Namespace:
    """The demo's flags (``--png``, ``--quick``) from ``argv`` (default: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument(
        "--png",
        default="funcprune-demo.png",
        metavar="PATH",
        help="where to save the figure (default: funcprune-demo.png in the current directory)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer training steps (a smoke test, as the tests run it)"
    )
    return parser.parse_args(argv)


def run(argv: Sequence[str] | None = None, *, prog: str = "python -m funcprune") -> None:
    """Parse the demo's flags from ``argv`` and run it."""
    args = parse(argv, prog=prog)
    main(quick=args.quick, png=args.png)

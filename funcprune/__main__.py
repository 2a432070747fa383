"""``python -m funcprune``: the demo (funcprune/_demo); ``--help`` says what it does."""

from __future__ import annotations

import argparse

from ._demo import main

_DESCRIPTION = """\
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


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m funcprune", description=_DESCRIPTION)
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


if __name__ == "__main__":
    args = _parse()
    main(quick=args.quick, png=args.png)

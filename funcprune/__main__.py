"""``python -m funcprune``: the demo (funcprune/_demo); ``--help`` says what it does.

The same demo is ``funcprune demo``; the other commands of the ``funcprune``
script (``oneshot``, ``structured``, ``eval``, ``report``) are in
funcprune/_cli.
"""

from __future__ import annotations

import argparse

from ._demo import main
from ._demo import parse as _parse_demo

__all__ = ["main"]


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    return _parse_demo(argv, prog="python -m funcprune")


if __name__ == "__main__":
    args = _parse()
    main(quick=args.quick, png=args.png)

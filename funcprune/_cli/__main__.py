"""``python -m funcprune._cli``: the ``funcprune`` console script, without installing it."""

from ._main import main

raise SystemExit(main())

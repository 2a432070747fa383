"""Progress on stderr: one tqdm bar per stage, with a rate, or nothing.

Bars are shown when stderr is a terminal and ``--quiet`` is not given
(a log file gets no carriage-return lines); transformers' own bars
(loading weights) follow the same choice. One-shot's blocks are counted
without a callback in ``fp.oneshot``: forward pre-hooks on the model's
repeated blocks (the runner's ``find_layers``, the list ``fp.oneshot``
walks) see each block run. The calibration batches are a generator that
advances the calibration bar as ``fp.oneshot`` draws them (its capture
pass); once they are exhausted, the capture is over, and from then on the
first run of block ``i`` means blocks ``0 .. i-1`` are done.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .._runner import find_layers

__all__ = ["Progress"]


class Progress:
    """Bars on stderr when ``enabled``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @staticmethod
    def wanted(quiet: bool) -> bool:
        """Whether to show bars: not ``--quiet`` and stderr a terminal."""
        return not quiet and sys.stderr.isatty()

    def bar(self, desc: str, total: int | None, unit: str) -> Any:
        """A tqdm bar on stderr (a disabled one when bars are off): ``update(n)``, ``close()``."""
        from tqdm import tqdm  # type: ignore[import-untyped]  # transformers' dependency; no stubs

        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not self.enabled, leave=True)

    @contextmanager
    def oneshot(self, model: torch.nn.Module, batches: list[Any]) -> Iterator[Iterable[Any]]:
        """``batches`` as ``fp.oneshot`` should draw them, with a calibration bar and a blocks bar."""
        blocks = find_layers("funcprune oneshot", model).modules
        calibration = self.bar("calibration", len(batches), "batch")
        walk = self.bar("blocks", len(blocks), "block")
        state = {"armed": False, "done": 0}

        def before(i: int) -> Any:
            def hook(module: torch.nn.Module, args: Any) -> None:
                if state["armed"] and i > state["done"]:
                    walk.update(i - state["done"])
                    state["done"] = i

            return hook

        def drawn() -> Iterator[Any]:
            for batch in batches:
                yield batch
                calibration.update(1)
            calibration.close()
            state["armed"] = True

        handles = [block.register_forward_pre_hook(before(i)) for i, block in enumerate(blocks)]
        try:
            yield drawn()
            walk.update(len(blocks) - state["done"])
        finally:
            for handle in handles:
                handle.remove()
            calibration.close()
            walk.close()

"""Python's cyclic garbage collector, paused while an analysis makes its bookkeeping.

The analysis of a model makes hundreds of thousands of small objects (a
1B Llama's, about 400,000 slices, their sets and the dicts that relate
them), and each few hundred of them trigger a collection; every third
generation's collection walks every object the process holds, the model's
modules and the exported graph included. On a 1.1B Llama that walking was
3.5-7 s of ``structure``'s 17-20 s. :func:`paused` turns the collector off
for the call and back on after, as it was: nothing cyclic that the call
drops is lost, only collected at the next collection after the call.
Reference counting, which frees the tensors, runs as always.

What the call keeps (a 1B Llama's ``structure`` keeps its analysis: about
1.3 million tracked objects) would be walked by the first collection after
it, and by the next, before it reached the oldest generation (0.25-0.27 s
for the first, at the end of ``structure``). On leaving, the objects made
inside go straight to the oldest generation (``gc.freeze`` then
``gc.unfreeze``, which put every tracked object there without walking it),
where they are walked at the next full collection, as everything long-lived
is. That is skipped where the process has frozen objects of its own (a
server about to fork): unfreezing would unfreeze theirs too. Nothing cyclic
is lost either way; it is collected at a full collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]


@contextmanager
def paused() -> Iterator[None]:
    """The collector off inside, and on after if it was on before (nested calls leave it to the outermost)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if not gc.get_freeze_count():  # (none of the process's own: freezing and unfreezing keeps them as they are)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


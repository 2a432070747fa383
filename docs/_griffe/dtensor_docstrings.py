"""A griffe extension for the API reference: docstrings show the DTensor specs of the registry.

``funcprune.compute_mask``'s docstring, as written, holds the marker
``{dtensor_specs}``; importing funcprune replaces it with what
``funcprune._dtensor.described()`` reads from the registry of the specs
computed on DTensors. Griffe reads the source, not the imported object, so
this extension makes the same replacement in the docstrings it loads.
"""

from __future__ import annotations

from typing import Any

try:
    from griffe import Extension
except ModuleNotFoundError:  # only pytest's doctest collection, without the docs extra
    Extension = object  # type: ignore[assignment,misc]

MARKER = "{dtensor_specs}"


class DTensorSpecs(Extension):  # type: ignore[misc]
    """Replace the marker in every docstring griffe loads with the registry's list."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and MARKER in obj.docstring.value:
            from funcprune import _dtensor

            obj.docstring.value = obj.docstring.value.replace(MARKER, _dtensor.described())

"""An MkDocs hook: the guide's list of the specs computed on DTensors, read from their registry.

Between the lines ``<!-- dtensor-specs -->`` and ``<!-- /dtensor-specs -->``
of a page, whatever is written is replaced, at build time, by what
``funcprune._dtensor.described()`` says of the registry (``ON_BLOCKS`` in
``funcprune/_dtensor/_dispatch.py``), the sentence ``compute_mask``'s
docstring also carries; a spec added there appears here with no edit.
"""

from __future__ import annotations

import re
from typing import Any

_REGION = re.compile(r"(<!-- dtensor-specs -->\n).*?(\n<!-- /dtensor-specs -->)", re.DOTALL)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """The page with its marked region replaced by the registry's list."""
    if "<!-- dtensor-specs -->" not in markdown:
        return markdown
    from funcprune import _dtensor

    listed = "On DTensors funcprune computes " + _dtensor.described().replace("``", "`") + "."
    return _REGION.sub(lambda m: m.group(1) + "\n" + listed + "\n" + m.group(2), markdown)

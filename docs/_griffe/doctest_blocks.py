"""A griffe extension for the API reference: fences the docstrings' bare doctests.

funcprune's docstrings put many of their ``>>>`` examples in the running
text rather than under an ``Examples:`` section. Griffe's Google-style
parser turns only the latter into code, so Markdown would read a bare
``>>> f(x)`` as three nested block quotes, and an output such as
``[0.0, 0.5]`` after a line ending in ``]`` as a reference link (a
``mkdocs_autorefs`` warning, which fails the strict build).

This extension wraps every run of lines that starts at the docstring's
left margin with ``>>>`` (its ``...`` continuations and its output
included, up to the next blank line) in a ``pycon`` code fence before the
docstring is parsed. Examples under an ``Examples:`` section are indented,
so griffe keeps handling them; fenced code is left alone.

mkdocs.yml loads it (``extensions:`` of the mkdocstrings Python handler).
pytest imports this file while collecting the doctests of ``docs/``, also
without the docs extra installed, hence the guarded import.
"""

from __future__ import annotations

from typing import Any

try:
    from griffe import Extension
except ModuleNotFoundError:  # only pytest's doctest collection, without the docs extra
    Extension = object  # type: ignore[assignment,misc]


def fence_doctests(text: str) -> str:
    """Return ``text`` with each bare doctest run wrapped in a ``pycon`` fence.

    >>> fence_doctests("Some text:\\n\\n>>> 1 + 1\\n2\\n\\nMore text.").split("\\n")
    ['Some text:', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More text.']
    """
    out: list[str] = []
    in_fence = in_doctest = False
    for line in text.split("\n"):
        if in_doctest and not line.strip():
            out.append("```")
            in_doctest = False
        elif not in_doctest and not in_fence and line.startswith(">>>"):
            out.append("```pycon")
            in_doctest = True
        elif not in_doctest and line.lstrip().startswith("```"):
            in_fence = not in_fence
        out.append(line)
    if in_doctest:
        out.append("```")
    return "\n".join(out)


class DoctestBlocks(Extension):  # type: ignore[misc]
    """Fence the bare doctests of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)

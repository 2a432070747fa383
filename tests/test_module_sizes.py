"""Rooms of a size one reads: no module of funcprune over 450 lines, none of ``funcprune.compat`` over 350.

A module of one concept reads in one sitting (``STYLE.md``: 100-350 lines
is the usual size); past the limit, it is split along its concepts, with
its subpackage's door and README saying where each now lives.
"""

from __future__ import annotations

from pathlib import Path

import funcprune

PACKAGE = Path(funcprune.__file__).parent
#: The most lines a module may have, and compat's own (it only adapts specs to torch's classes and hooks).
LIMIT, COMPAT_LIMIT = 450, 350
#: Modules allowed over the limit for now (none).
NOT_YET_SPLIT: frozenset[str] = frozenset()


def limit(module: str) -> int:
    return COMPAT_LIMIT if module.startswith("compat/") else LIMIT


def oversized(root: Path) -> dict[str, int]:
    """The modules under ``root`` over their limit, with their line counts."""
    sizes = {
        path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    return {module: n for module, n in sizes.items() if n > limit(module)}


def test_no_module_is_over_its_limit() -> None:
    over = oversized(PACKAGE)
    assert {module: n for module, n in over.items() if module not in NOT_YET_SPLIT} == {}


def test_the_limits_count_every_line(tmp_path: Path) -> None:
    (tmp_path / "compat").mkdir()
    (tmp_path / "compat" / "_big.py").write_text("x = 1\n" * (COMPAT_LIMIT + 1), encoding="utf-8")
    (tmp_path / "compat" / "_fits.py").write_text("x = 1\n" * COMPAT_LIMIT, encoding="utf-8")
    (tmp_path / "_fits.py").write_text("x = 1\n" * LIMIT, encoding="utf-8")
    (tmp_path / "_big.py").write_text("x = 1\n" * LIMIT + "x = 1", encoding="utf-8")  # a last line without its newline counts too
    assert oversized(tmp_path) == {"compat/_big.py": COMPAT_LIMIT + 1, "_big.py": LIMIT + 1}

"""``[tool.dqtool.lint]`` in the linted project's ``pyproject.toml`` (target, select,
ignore), found by searching upward from the working directory; options given on the command
line or to ``lint()`` override it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from dqtool.errors import UsageError


@dataclass(frozen=True)
class LintConfig:
    target: str | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    source: str | None = None  # the pyproject.toml it came from


def _codes(value: object, key: str, path: Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{path}: [tool.dqtool.lint] {key} must be a list of rule codes")
    return tuple(v.strip().upper() for v in value)


def find(start: Path | None = None) -> LintConfig:
    """The nearest pyproject.toml with a [tool.dqtool.lint] table, upward from ``start``."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "pyproject.toml"
        if not path.is_file():
            continue
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:  # TOML is UTF-8 (a UTF-16 file from an editor)
            raise UsageError(f"{path}: cannot read (not UTF-8 text: byte {e.start} is "
                             f"{e.object[e.start:e.start + 1]!r}; TOML files are UTF-8)"
                             ) from None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"{path}: cannot read ({e})") from None
        table = doc.get("tool", {}).get("dqtool", {}).get("lint")
        if table is None:
            continue
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [tool.dqtool.lint] must be a table")
        unknown = sorted(set(table) - {"target", "select", "ignore"})
        if unknown:
            raise UsageError(f"{path}: unknown [tool.dqtool.lint] keys: {', '.join(unknown)}")
        target = table.get("target")
        if target is not None and not isinstance(target, str):
            raise UsageError(f"{path}: [tool.dqtool.lint] target must be a string")
        return LintConfig(target, _codes(table.get("select"), "select", path),
                          _codes(table.get("ignore"), "ignore", path), str(path))
    return LintConfig()

"""Writes the generated parts of ``docs/`` (``make docs``).

- ``docs/rules.md``: the lint rule and target tables, from the rule and target registries.
  tests/test_docs.py fails when the committed page differs from what this writes.
- Documented examples: a fenced block marked ``sh`` whose first line starts with ``dqtool``
  holds commands, one per line, each ending in ``# exit N``. They run in order, per page, in
  a scratch folder holding a copy of ``models/``; the fenced ``text`` block right after such
  a block gets their real output. The tests run the same commands and check the exit codes.

    python docs/build.py              # the rule table and every page's example output
    python docs/build.py --rules      # only the rule table (fast)
    python docs/build.py docs/commands/fold.md   # the rule table and one page's examples
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
RULES_PAGE = DOCS / "rules.md"
# Tables are rendered at this width in the pages, whatever the terminal.
ENV = {"NO_COLOR": "1", "COLUMNS": "140"}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # 1-based line of the command in the page
    command: str  # as written, without the exit comment
    exit_code: int

    def argv(self) -> list[str]:
        words = shlex.split(self.command)
        if not words or words[0] != "dqtool":
            raise ValueError(f"{self.where}: an example must start with `dqtool`")
        return words[1:]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return sorted([ROOT / "README.md", *DOCS.rglob("*.md")])


def example_blocks(text: str) -> Iterator[tuple[re.Match[str], re.Match[str] | None]]:
    """Each ``sh`` block of dqtool commands, with the ``text`` block right after it if any."""
    fences = list(_FENCE.finditer(text))
    for i, m in enumerate(fences):
        if m.group(1) != "sh" or not m.group(2).lstrip().startswith("dqtool"):
            continue
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        follows = nxt is not None and nxt.group(1) == "text" and \
            text[m.end():nxt.start()].strip() == ""
        yield m, nxt if follows else None


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    found = []
    for block, _ in example_blocks(text):
        first = text.count("\n", 0, block.start(2)) + 1
        for line, offset in _logical_lines(block.group(2)):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = _EXIT.search(line)
            where = f"{page.relative_to(ROOT)}:{first + offset}"
            if m is None:
                raise ValueError(f"{where}: an example command must end with `# exit N`")
            found.append(Example(page, first + offset, line[:m.start()].strip(),
                                 int(m.group(1))))
    return found


def _logical_lines(body: str) -> Iterator[tuple[str, int]]:
    """Lines joined across trailing backslashes, with the offset of each one's first line."""
    pending, start = "", 0
    for i, line in enumerate(body.splitlines()):
        if not pending:
            start = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line, start
        pending = ""
    if pending:
        yield pending, start


def scratch() -> tempfile.TemporaryDirectory[str]:
    """A folder holding a copy of ``models/``: examples may write next to their input."""
    folder = tempfile.TemporaryDirectory(prefix="dqtool-docs-")
    shutil.copytree(ROOT / "models", Path(folder.name) / "models",
                    ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return folder


def run(example: Example, cwd: Path) -> tuple[int, str]:
    """Run one example in-process from ``cwd``: (exit code, what a terminal shows)."""
    from click.testing import CliRunner

    from dqtool.cli import cli

    here = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli, example.argv(), env=ENV, prog_name="dqtool")
    finally:
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"{example.where}: {example.command} raised "
                           f"{result.exception!r}") from result.exception
    shown = result.output.replace(f"{cwd}{os.sep}", "")
    return result.exit_code, "\n".join(line.rstrip() for line in shown.splitlines())


def refresh_examples(page: Path) -> bool:
    """Rewrite the output blocks of ``page`` with what its examples print; True if changed."""
    text = page.read_text()
    pieces, last = [], 0
    with scratch() as folder:
        for block, output in example_blocks(text):
            lines = []
            for ex in examples_in(page, text, block):
                code, shown = run(ex, Path(folder))
                if code != ex.exit_code:
                    raise RuntimeError(f"{ex.where}: exit {code}, the page says {ex.exit_code}"
                                       f"\n{shown}")
                lines.append(shown.rstrip("\n"))
            if output is None:
                continue
            shown = "\n".join(lines).rstrip() + "\n"
            if _untimed(shown) == _untimed(output.group(2)):
                shown = output.group(2)  # only a timing moved: keep the page as it is
            pieces += [text[last:output.start(2)], shown]
            last = output.end(2)
    new = "".join([*pieces, text[last:]])
    if new != text:
        page.write_text(new)
    return new != text


def _untimed(text: str) -> str:
    return re.sub(r'"seconds": [0-9.e-]+', '"seconds": _', text)


def examples_in(page: Path, text: str, block: re.Match[str]) -> list[Example]:
    lo, hi = text.count("\n", 0, block.start()) + 1, text.count("\n", 0, block.end()) + 1
    return [ex for ex in examples(page) if lo <= ex.line <= hi]


def rules_page() -> str:
    """docs/rules.md: every lint rule the rule registry holds and every target the target
    registry holds."""
    # registry.load, not dqtool.linting.rules: once the rule modules are imported, that name
    # is the dqtool.linting.rules package, not the function.
    from dqtool.linting.registry import load as rules
    from dqtool.linting.targets import table

    head = ["# Lint rules and targets", "",
            "<!-- Generated by `make docs` (docs/build.py) from the rule and target "
            "registries; do not edit. -->", "",
            "## Rules", "",
            "Every rule `dqtool lint` knows, by code. DQ010–DQ019 are also the problem codes "
            "the codecs find while reading a node (`QuantSpec.problems`, shown by "
            "`dqtool inspect`), and FU001–FU006 those of MatMulNBits / GatherBlockQuantized "
            "(`FusedSpec.problems`); `dqtool check` counts both; DQ1xx run only with "
            "`--target` "
            "(see [lint](commands/lint.md#targets)). `--select` and `--ignore` take codes or "
            "prefixes (`DQ0`, `DQ101`).", "",
            "| code | name | severity | meaning | example message |",
            "|---|---|---|---|---|"]
    rows = [f"| {r.code} | `{r.name}` | {r.severity} | {_cell(r.summary)} | "
            f"{_cell(r.example, code=True)} |" for _, r in sorted(rules().items())]
    targets = ["", "## Targets", "",
               "Every value `--target` takes; what each encodes is in "
               "[lint](commands/lint.md#targets).", "",
               "| target | what it is |", "|---|---|",
               *(f"| `{t.name}` | {_cell(t.summary)} |" for t in table())]
    return "\n".join([*head, *rows, *targets]) + "\n"


def _cell(text: str, code: bool = False) -> str:
    text = text.replace("|", "\\|")
    if not code:
        return text
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def main(argv: list[str]) -> int:
    RULES_PAGE.write_text(rules_page())
    print(f"wrote {RULES_PAGE.relative_to(ROOT)}")
    if "--rules" in argv:
        return 0
    chosen = [Path(a).resolve() for a in argv if not a.startswith("-")] or pages()
    for page in chosen:
        if examples(page) and refresh_examples(page):
            print(f"refreshed the examples of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))

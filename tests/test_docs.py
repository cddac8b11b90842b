"""The documentation cannot drift from the code: every option a command's ``--help`` shows
is on its page and vice versa (read from click's command objects), the rule table is the
one the rule registry generates, every documented example still runs on ``models/`` with
the exit code its page says (and its JSON fields are the documented ones), and every link
and every ``docs/semantics.md#anchor`` the code cites leads somewhere."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import click
import pytest

from dqtool.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMAND_PAGES = DOCS / "commands"

_spec = importlib.util.spec_from_file_location("docs_build", DOCS / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
sys.modules["docs_build"] = build
_spec.loader.exec_module(build)

_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_FENCED = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


# -- options ------------------------------------------------------------------------------

def command(name: str | None) -> click.Command:
    return cli if name is None else cli.get_command(click.Context(cli), name)


def help_options(cmd: click.Command) -> set[str]:
    """Every option spelling ``--help`` shows, except the help option itself."""
    ctx = click.Context(cmd, info_name=cmd.name, help_option_names=["-h", "--help"])
    help_names = set(ctx.help_option_names)
    found = set()
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option) and not p.hidden:
            found |= {o for o in (*p.opts, *p.secondary_opts) if o not in help_names}
    return found


def table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``## heading``, without its header."""
    m = re.search(rf"^##\s+{re.escape(heading)}\s*$", text, re.M)
    if m is None:
        return []
    rows, started = [], False
    for line in text[m.end():].splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
        elif started or line.startswith("#"):
            break
    return [r for r in rows[2:]]


def page_options(text: str) -> set[str]:
    """Option spellings in the first column of a page's Options table (inside backticks)."""
    found = set()
    for cells in table_after(text, "Options"):
        for span in re.findall(r"`([^`]*)`", cells[0]):
            found |= set(_OPTION.findall(span))
    return found


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_a_page_listed_in_the_index(name: str):
    assert (COMMAND_PAGES / f"{name}.md").is_file(), f"docs/commands/{name}.md is missing"
    assert f"]({name}.md)" in (COMMAND_PAGES / "README.md").read_text()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_page_has_the_sections_a_user_looks_for(name: str):
    text = (COMMAND_PAGES / f"{name}.md").read_text()
    headings = set(re.findall(r"^##\s+(.*?)\s*$", text, re.M))
    wanted = {"Options", "Exit codes", "Examples"}
    if {"--json", "--format"} & help_options(command(name)):
        wanted.add("JSON")
    assert wanted - headings == set()
    assert text.startswith(f"# dqtool {name}\n")


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_options_on_the_page_are_the_options_of_help(name: str | None):
    page = COMMAND_PAGES / ("README.md" if name is None else f"{name}.md")
    documented, shown = page_options(page.read_text()), help_options(command(name))
    assert shown, "no options read from click: the comparison would prove nothing"
    assert shown - documented == set(), f"{page.name}: options --help shows, not on the page"
    assert documented - shown == set(), f"{page.name}: options on the page that do not exist"


def test_the_option_reader_sees_a_missing_and_an_extra_option():
    page = ("## Options\n\n| option | meaning |\n|---|---|\n"
            "| `-o`, `--output OUT` | x |\n| `--a/--no-a` | y |\n| `--dtype keep\\|f` | z |\n"
            "\n## Next\n| `--not-options` | x |\n")
    assert page_options(page) == {"-o", "--output", "--a", "--no-a", "--dtype"}
    assert page_options("no table here") == set()


# -- the rule table -------------------------------------------------------------------------

def test_rule_table_is_the_one_the_registry_generates():
    assert (DOCS / "rules.md").read_text() == build.rules_page(), \
        "docs/rules.md differs from the rule or target registry: run `make docs`"


def test_target_table_has_one_row_per_registered_target():
    from dqtool.linting.targets import names

    text = (DOCS / "rules.md").read_text()
    rows = re.findall(r"^\| `([\w.-]+)` \|", text.split("## Targets")[1], re.M)
    assert rows == list(names()) and "onnxruntime" in rows


def test_rule_table_has_one_row_per_registered_rule():
    from dqtool.linting.registry import load as rules

    rows = [line.split("|")[1].strip() for line in (DOCS / "rules.md").read_text().splitlines()
            if re.match(r"\| (DQ|FU)\d{3} ", line)]
    assert rows == sorted(rules()) and len(rows) >= 20


# -- examples -------------------------------------------------------------------------------

EXAMPLE_PAGES = [p for p in build.pages() if any(build.example_blocks(p.read_text()))]


def documented_fields(page: Path) -> set[str]:
    """The JSON fields a page lists, or those of the page its ``…md#json`` link names."""
    text = page.read_text()
    fields = {cells[0].strip("`") for cells in table_after(text, "JSON")
              if cells and cells[0].startswith("`")}
    link = re.search(r"\]\(([\w./-]+\.md)#json\)", text)
    if not fields and link:
        return documented_fields(page.parent / link.group(1))
    return fields


def json_fields(doc: object, documented: set[str], prefix: str = "") -> set[str]:
    """Key paths of ``doc`` as the pages write them: ``a.b``, ``a[].b``, ``a.<name>.b``;
    a dict is entered only where the page documents something inside it."""
    found: set[str] = set()
    if not isinstance(doc, dict):
        return found
    for key, value in doc.items():
        path = f"{prefix}{key}"
        found.add(path)
        inner = [d for d in documented if d.startswith(f"{path}.") or d.startswith(f"{path}[].")]
        if isinstance(value, dict) and inner:
            placeholder = re.match(rf"{re.escape(path)}\.(<\w+>)", inner[0])
            if placeholder:
                for sub in value.values():
                    found |= json_fields(sub, documented, f"{path}.{placeholder.group(1)}.")
                found |= {f"{path}.{placeholder.group(1)}"} & documented
            else:
                found |= json_fields(value, documented, f"{path}.")
        elif isinstance(value, list) and inner:
            for item in value:
                found |= json_fields(item, documented, f"{path}[].")
    return found


def test_every_command_page_has_examples():
    names = {p.stem for p in EXAMPLE_PAGES if p.parent == COMMAND_PAGES}
    assert set(COMMANDS) <= names


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_examples_run_with_the_exit_code_the_page_says(page: Path):
    documented = documented_fields(page)
    seen_top: set[str] = set()
    with build.scratch() as folder:
        for ex in build.examples(page):
            code, shown = build.run(ex, Path(folder))
            assert code == ex.exit_code, f"{ex.where}: `{ex.command}` exited {code}, the " \
                                         f"page says {ex.exit_code}\n{shown}"
            if "--json" not in ex.argv() and "json" not in ex.argv():
                continue
            doc = json.loads(shown[shown.index("{"):shown.rindex("}") + 1])
            fields = json_fields(doc, documented)
            assert fields - documented == set(), f"{ex.where}: JSON fields not on the page"
            seen_top |= {f for f in fields if "." not in f and "[" not in f}
    top = {f for f in documented if "." not in f and "[" not in f}
    assert top - seen_top == set(), f"{page.name}: documented JSON fields no example prints"


def test_the_example_reader_requires_an_exit_code(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(build, "ROOT", tmp_path)
    page = tmp_path / "p.md"
    page.write_text("```sh\ndqtool inspect a.onnx   # exit 2\ndqtool \\\n  lint b.onnx  # exit 1"
                    "\n```\n\n```sh\nmake run\n```\n")
    assert [(e.command, e.exit_code, e.line) for e in build.examples(page)] == \
        [("dqtool inspect a.onnx", 2, 2), ("dqtool    lint b.onnx", 1, 3)]
    page.write_text("```sh\ndqtool inspect a.onnx\n```\n")
    with pytest.raises(ValueError, match="must end with `# exit N`"):
        build.examples(page)


def test_the_json_field_reader_follows_what_the_page_documents():
    doc = {"a": 1, "m": {"x": {"s": 1}, "y": {"s": 2}}, "l": [{"k": 1}], "o": {"p": 1}}
    documented = {"a", "m", "m.<name>.s", "l", "l[].k", "o"}
    assert json_fields(doc, documented) == {"a", "m", "m.<name>.s", "l", "l[].k", "o"}
    assert json_fields({"renamed": 1}, documented) == {"renamed"}


# -- links and citations --------------------------------------------------------------------

def slugs(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    text = _FENCED.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("page", build.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_to_files_and_headings_that_exist(page: Path):
    for target in _LINK.findall(_FENCED.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: link to missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in slugs(dest), f"{page.relative_to(ROOT)}: no heading #{anchor}"


def test_code_cites_semantics_sections_that_exist():
    anchors = slugs(DOCS / "semantics.md")
    cited = {m for f in (ROOT / "dqtool").rglob("*.py")
             for m in re.findall(r"docs/semantics\.md#([\w-]+)", f.read_text())}
    assert cited, "no citation found: the search is wrong"
    assert cited - anchors == set()


def test_code_cites_no_document_outside_the_repository():
    pattern = re.compile(r"SEMANTICS\.md|\b[Ss]eed 0\d\d\b|\b[Ii]ssue #?\d+\b|§|seed document")
    files = [*(ROOT / "dqtool").rglob("*.py"), *(ROOT / "models").glob("*.py"),
             *(ROOT / "bench").glob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "models").glob("*.md")]
    hits = [f"{f.relative_to(ROOT)}:{i}" for f in files if f.name != "test_docs.py"
            for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert len(files) > 50 and hits == []


def test_readme_is_short_and_every_command_is_one_click_away():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 12 * 1024
    for name in COMMANDS:
        assert f"(docs/commands/{name}.md)" in readme, name

"""The fuzz harness (tools/fuzz): its judge, the saved reproducers, and a short campaign.

``make test`` replays every reproducer in tests/fuzz_regressions/ and fuzzes for a short
budget (DQTOOL_FUZZ_SECONDS, default 30; DQTOOL_FUZZ_SEED picks the seed); ``make fuzz
FUZZ_SECONDS=3600`` goes long.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.fuzz import (  # noqa: E402
    hostile_attributes,
    hostile_names,
    hostile_outputs,
    hostile_paths,
    known,
    shared_data,
)
from tools.fuzz.campaign import Campaign  # noqa: E402
from tools.fuzz.case import Case  # noqa: E402
from tools.fuzz.observe import external_reads  # noqa: E402
from tools.fuzz.run import Entry, judge, preload, run  # noqa: E402

REGRESSIONS = sorted(p.parent for p in (REPO / "tests" / "fuzz_regressions").glob("*/case.json"))
SECONDS = float(os.environ.get("DQTOOL_FUZZ_SECONDS", "30"))
SEED = int(os.environ.get("DQTOOL_FUZZ_SEED", "0"))


@pytest.fixture(scope="module", autouse=True)
def _preloaded():
    preload()


# -- the judge, on snapshots made by hand ----------------------------------------------------
def _file(digest: str, ino: int = 1) -> Entry:
    return Entry("file", ino, 10, 1, digest)


MODEL = {"in": Entry("dir", 1, 0, 0, ""), "in/m.onnx": _file("a"),
         "out": Entry("dir", 2, 0, 0, ""), "outside/sentinel.txt": _file("s", 3)}
FOLD = Case("structure", "k", ["fold", "in/m.onnx", "-o", "out/o.onnx"])
INSPECT = Case("structure", "k", ["inspect", "in/m.onnx"])


def test_judge_clean_runs():
    assert judge(INSPECT, MODEL, MODEL, 0, "") == ("clean", "")
    assert judge(INSPECT, MODEL, MODEL, 2, "dqtool: error: in/m.onnx: broken\n")[0] == "clean"
    written = {**MODEL, "out/o.onnx": _file("o", 9)}
    assert judge(FOLD, MODEL, written, 0, "dqtool: warning: something\n")[0] == "clean"


@pytest.mark.parametrize(("case", "after", "code", "stderr", "verdict"), [
    (INSPECT, MODEL, 1, "Traceback (most recent call last):\n  x\nValueError: y\n", "traceback"),
    (INSPECT, MODEL, 3, "", "bad-exit"),
    (INSPECT, MODEL, 2, "onnx_ir: cannot be found\ndqtool: error: in/m.onnx: x\n",
     "multi-line-error"),
    (INSPECT, MODEL, 2, "dqtool: error: main graph: a cycle\n", "wrong-file"),
    (INSPECT, MODEL, 2, "Error: no such option\n", "not-one-error-line"),
    (INSPECT, MODEL, 0, "Input 'x' of node 'y' cannot be found in any scope\n", "stray-stderr"),
    (FOLD, {**MODEL, "out/o.onnx": _file("o")}, 2, "dqtool: error: in/m.onnx: x\n",
     "written-on-refusal"),
    (FOLD, {**MODEL, "in/m.onnx": _file("changed")}, 0, "", "input-modified"),
    (FOLD, {**MODEL, "outside/sentinel.txt": _file("changed", 3)}, 0, "", "outside-touched"),
    (FOLD, {**MODEL, "outside/new": _file("n", 4)}, 0, "", "outside-touched"),
    (FOLD, {**MODEL, "out/.o.onnx.abc": Entry("dir", 5, 0, 0, "")}, 0, "", "leftover-temp"),
])
def test_judge_failures(case, after, code, stderr, verdict):
    assert judge(case, MODEL, after, code, stderr)[0] == verdict


def test_judge_non_regular_output_replaced():
    before = {**MODEL, "out/pipe": Entry("fifo", 7, 0, 0, "")}
    case = Case("output", "fifo", ["fold", "in/m.onnx", "-o", "out/pipe"])
    assert judge(case, before, {**MODEL, "out/pipe": _file("o", 8)}, 0, "")[0] == \
        "non-regular-replaced"
    assert judge(case, before, before, 2, "dqtool: error: out/pipe: not a file\n")[0] == "clean"


def test_in_place_may_change_the_input_only_on_success():
    case = Case("structure", "k", ["fold", "in/m.onnx", "--in-place"])
    after = {**MODEL, "in/m.onnx": _file("new", 8)}
    assert judge(case, MODEL, after, 0, "")[0] == "clean"
    assert judge(case, MODEL, after, 2, "dqtool: error: in/m.onnx: x\n")[0] == "input-modified"


# -- the checks of the hostile campaign of 2026-11: what is printed, what others read -------
ERR = "dqtool: error: in/m.onnx: node "


@pytest.mark.parametrize(("stdout", "stderr", "code"), [
    (b"node n\x1b[31mred\n", "", 0),  # an escape sequence the terminal obeys
    (b"node \xe2\x80\xaeevil\n", "", 0),  # U+202E, a bidi override
    (b"node a\xe2\x80\x8db\n", "", 0),  # a zero-width joiner
    (b"node a\x00b\n", "", 0),  # NUL
    (b"node a\rb\n", "", 0),  # a carriage return
    (b"node o\xff.onnx\n", "", 0),  # bytes that are not UTF-8
    (b"", ERR + "'n\nTraceback (most recent call last):x'\n", 2),  # a forged line
    (b"", ERR + "'a\x1b]0;title\x07'\n", 2),  # a title sequence, on stderr
])
def test_judge_raw_output_is_caught(stdout, stderr, code):
    verdict, detail = judge(INSPECT, MODEL, MODEL, code, stderr, stdout=stdout)
    assert verdict == "raw-control", (verdict, detail)
    assert detail.isprintable()  # the report shows it escaped, never raw


def test_judge_escaped_output_is_clean():
    stdout = b"node n\\x1b[31m \\u202e \\x00 \\xff caf\xc3\xa9 \xe5\x90\x8d\n"
    assert judge(INSPECT, MODEL, MODEL, 0, "", stdout=stdout) == ("clean", "")
    # The forged header escaped is mid-line text, not a traceback (nor a raw line).
    err = ERR + "'n\\nTraceback (most recent call last):x'\n"
    assert judge(INSPECT, MODEL, MODEL, 2, err) == ("clean", "")


def test_judge_json_output_must_parse():
    case = Case("names", "k", ["inspect", "--json", "in/m.onnx"])
    assert judge(case, MODEL, MODEL, 0, "", stdout=b'{"name": "\\u001b[31m"}\n')[0] == "clean"
    assert judge(case, MODEL, MODEL, 0, "", stdout=b'{"name": ')[0] == "bad-json"
    lint = Case("names", "k", ["lint", "--format", "sarif", "in/m.onnx"])
    assert judge(lint, MODEL, MODEL, 1, "", stdout=b"[1, 2")[0] == "bad-json"


def test_judge_expectations_and_a_missing_output():
    refused = Case("paths", "k", ["inspect", "in/m.onnx"], expect="refused")
    assert judge(refused, MODEL, MODEL, 0, "")[0] == "not-refused"
    assert judge(refused, MODEL, MODEL, 2, "dqtool: error: in/m.onnx: x\n")[0] == "clean"
    works = Case("paths", "k", ["inspect", "in/m.onnx"], expect="works")
    assert judge(works, MODEL, MODEL, 2, "dqtool: error: in/m.onnx: x\n")[0] == "refused-valid"
    assert judge(FOLD, MODEL, MODEL, 0, "")[0] == "output-missing"  # exit 0, nothing there
    assert judge(FOLD, MODEL, {**MODEL, "out/o.onnx": _file("o", 9)}, 0, "")[0] == "clean"


def _shared(tmp_path: Path, kind: str = "shared-named") -> tuple[Case, dict]:
    case = shared_data.make(kind, 0, True)  # fold in/model.onnx -o out/x.onnx
    case.materialize(tmp_path)
    return case, external_reads(tmp_path, {"out/x.onnx"})


def test_judge_other_models_data_removed_or_replaced(tmp_path):
    case, reads = _shared(tmp_path)
    assert any(model == "out/other.onnx" for model, *_ in reads)
    assert all(model != "out/x.onnx" for model, *_ in reads)  # the output may change
    data = tmp_path / "out" / "x.onnx.data"
    data.write_bytes(data.read_bytes()[:100])  # replaced by the new output's data
    after = {"out/x.onnx": _file("n")}
    verdict, detail = judge(case, {}, after, 0, "", root=tmp_path, reads=reads)
    assert verdict == "other-model-broken" and "out/other.onnx" in detail, detail
    data.unlink()
    assert judge(case, {}, after, 0, "", root=tmp_path, reads=reads)[0] == \
        "other-model-broken"


def test_judge_other_models_intact_is_clean(tmp_path):
    case, reads = _shared(tmp_path, "fresh-name")
    (tmp_path / "out" / "x.onnx").write_bytes(b"new output")
    (tmp_path / "out" / "x.onnx.data").write_bytes(b"its data")
    after = {"out/x.onnx": _file("n")}
    assert judge(case, {}, after, 0, "", root=tmp_path, reads=reads) == ("clean", "")


def test_a_case_with_bytes_that_are_not_utf8_round_trips(tmp_path):
    out = os.fsdecode(b"out/o\xff\x1b.onnx")
    case = Case("output", "not-utf8", ["fold", "in/m.onnx", "-o", out],
                {"in/m.onnx": b"x", os.fsdecode(b"in/d\xfe.bin"): b"y"},
                [("dir", os.fsdecode(b"out/d\xff"), "")], expect="works")
    case.save(tmp_path / "r", "a failure")
    assert "\\udcff" in (tmp_path / "r" / "case.json").read_text()
    assert Case.load(tmp_path / "r") == case


@pytest.mark.parametrize("make", [
    lambda: hostile_paths.make("parent-link", 6),
    lambda: hostile_paths.make("link-dotdot-escape", 0),
    lambda: hostile_names.make("all", "everything", "weight", 1),
    lambda: hostile_attributes.make("GatherBlockQuantized.bits=3", "nbits4", 0),
    lambda: shared_data.make("shared-plain", 0, True),
    lambda: hostile_outputs.make("not-utf8", 0, False),
], ids=["parent-link", "escape", "names-json", "gbq-bits", "shared", "not-utf8"])
def test_a_case_of_each_new_family_runs_clean(make):
    outcome = run(make(), timeout=120)
    assert outcome.verdict == "clean", (outcome.detail, outcome.stderr[-2000:])


# -- real runs ---------------------------------------------------------------------------------
def test_a_usage_error_is_one_line_and_a_second_line_is_caught(monkeypatch):
    case = Case("output", "usage", ["fold", "in/m.onnx", "--no-such-option"],
                {"in/m.onnx": b"x"})
    outcome = run(case, timeout=60)
    # One line; it names no file (there is none at fault), which the judge says as such.
    assert outcome.exit_code == 2 and outcome.stderr.count("\n") == 1, outcome
    assert outcome.verdict == "wrong-file"

    import dqtool.cli.app

    real = dqtool.cli.app.App.abort

    def two_lines(self, message, code=2):
        print("a stray line", file=sys.stderr)
        real(self, message, code)

    monkeypatch.setattr(dqtool.cli.app.App, "abort", two_lines)
    outcome = run(case, timeout=60)
    assert outcome.exit_code == 2 and outcome.verdict == "multi-line-error", outcome


def test_a_run_that_crashes_is_caught(monkeypatch):
    """The runner forks this process: a bug planted here is what the child runs."""
    import dqtool.inspection

    def broken(path):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(dqtool.inspection, "inspect", broken)
    case = Case("structure", "planted", ["inspect", "in/m.onnx"],
                {"in/m.onnx": (REPO / "models" / "dq13_int8_per_axis.onnx").read_bytes()})
    outcome = run(case, timeout=60)
    assert outcome.verdict == "traceback" and "planted bug" in outcome.detail


def test_an_output_case_runs_clean_or_is_known():
    outcome = run(hostile_outputs.make("directory", 0, False), timeout=120)
    assert outcome.verdict == "clean", outcome.detail


@pytest.mark.parametrize("folder", REGRESSIONS, ids=[p.name for p in REGRESSIONS])
def test_reproducer_replays_clean(folder):
    case = Case.load(folder)
    outcome = run(case, timeout=120)
    why = known.known(case.family, case.kind, outcome.verdict)
    if why is not None:
        pytest.xfail(f"known: {why}")
    assert outcome.clean, f"{outcome.verdict}: {outcome.detail}\n{outcome.stderr[-2000:]}"


def test_short_campaign_finds_nothing(tmp_path):
    campaign = Campaign(SECONDS, SEED, tmp_path, timeout=120, log=lambda _: None)
    result = campaign.go()
    assert result.runs > 0
    found = [f"{o.verdict}: {c.label}: {o.detail}" for c, o in result.findings]
    assert not found, ("fuzz findings (reproducers: python -m tools.fuzz --seed "
                       f"{SEED} --seconds {SECONDS:.0f}):\n" + "\n".join(found))

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

from tools.fuzz import hostile_outputs, known  # noqa: E402
from tools.fuzz.campaign import Campaign  # noqa: E402
from tools.fuzz.case import Case  # noqa: E402
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

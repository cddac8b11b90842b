"""dqtool check: alone (structure + every DQ on onnxruntime vs the kernel) and --against."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import dq_model, matmul_model, save
from onnx import TensorProto

import dqtool
from dqtool.checking import check
from dqtool.checking.inputs import InputSpec, check_given, load_npz
from dqtool.cli import cli
from dqtool.errors import UsageError

ENV = {"NO_COLOR": "1", "COLUMNS": "80"}


def run(*args: str):
    return CliRunner(env=ENV).invoke(cli, list(args))


def weights(seed: int = 1):
    r = np.random.default_rng(seed)
    return (r.integers(-127, 128, (16, 4)).astype(np.int8),
            r.uniform(0.01, 0.05, 4).astype(np.float32))


@pytest.mark.parametrize("path", ["models/ort_qdq_per_channel.onnx",
                                  "models/ort_qdq_per_tensor.onnx"])
def test_real_qdq_model_passes_bit_exact(path):
    report = check(path)
    doc = report.to_json()
    assert report.passed and doc["summary"]["bit-exact"] == 12
    assert doc["structure"]["onnx_checker"] == "passed"
    assert "ORT_DISABLE_ALL" in doc["runtimes"][0]["description"]


@pytest.mark.parametrize("path", ["models/dq19_uint8_bfloat16_scale.onnx",
                                  "models/dq23_float4e2m1_output_dtype.onnx"])
def test_nodes_onnxruntime_cannot_run_are_kernel_only(path):
    report = check(path)
    assert report.passed
    kernel_only = [n for n in report.nodes if n.status == "kernel-only"]
    assert kernel_only and all("onnxruntime cannot run" in n.reason for n in kernel_only)


def test_small_bfloat16_and_float4_models_pass(tmp_path):
    bf = dq_model(np.arange(8, dtype=np.uint8).reshape(2, 4),
                  np.array(0.5, ml_dtypes.bfloat16), opset=19, ir_version=9,
                  out_type=TensorProto.BFLOAT16)
    f4 = dq_model(np.array([0, 1, 1.5, -6], ml_dtypes.float4_e2m1fn),
                  np.array(2.0, np.float32), opset=23, ir_version=11)
    for m in (bf, f4):
        result = run("check", str(save(m, tmp_path / "m.onnx")), "--json")
        doc = json.loads(result.output)
        assert result.exit_code == 0, result.output
        assert doc["nodes"][0]["status"] == "kernel-only"


def test_tampered_scale_fails_against_and_names_worst_index(tmp_path):
    w, s = weights()
    original = save(matmul_model(w, s, opset=13), tmp_path / "orig.onnx")
    converted = matmul_model(w, s, opset=21)  # a valid upgrade: DQ-13 → DQ-21
    ok = save(converted, tmp_path / "conv.onnx")
    assert run("check", str(ok), "--against", str(original)).exit_code == 0
    s_bad = s.copy()
    s_bad[2] *= 1.5
    bad = save(matmul_model(w, s_bad, opset=21), tmp_path / "bad.onnx")
    result = run("check", str(bad), "--against", str(original), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert not doc["passed"]
    for comp in doc["comparisons"]:
        (y,) = comp["outputs"]
        assert not y["passed"] and y["worst_index"] == [0, 2]
        assert y["worst_actual"] != y["worst_expected"]
        assert y["min_atol"] == y["max_abs"] > 0


def test_tolerance_relaxes_against(tmp_path):
    w, s = weights()
    original = save(matmul_model(w, s), tmp_path / "orig.onnx")
    s_bad = s.copy()
    s_bad[0] *= 1 + 1e-6
    bad = save(matmul_model(w, s_bad), tmp_path / "bad.onnx")
    assert not check(bad, against=original).passed
    assert check(bad, against=original, rtol=1e-4).passed


def test_against_text_output_states_runtimes(tmp_path):
    w, s = weights()
    p = save(matmul_model(w, s), tmp_path / "m.onnx")
    result = run("check", str(p), "--against", str(p))
    assert result.exit_code == 0
    assert "ORT_DISABLE_ALL" in result.output and "dqtool.reference_evaluator" in result.output
    assert "PASSED" in result.output


def test_symbolic_dims_default_and_shape_option(tmp_path):
    w, s = weights()
    p = save(matmul_model(w, s), tmp_path / "m.onnx")
    r = check(p)
    assert r.inputs["X"]["shape"] == [1, 16] and r.defaulted_dims == ("X[0] (batch)",)
    r = check(p, shapes={"batch": (3,)})
    assert r.inputs["X"]["shape"] == [3, 16] and not r.defaulted_dims
    result = run("check", str(p), "--shape", "X=2,16", "--json")
    assert json.loads(result.output)["inputs"]["X"]["shape"] == [2, 16]


def test_inputs_npz_and_seed(tmp_path):
    w, s = weights()
    p = save(matmul_model(w, s), tmp_path / "m.onnx")
    x = np.ones((5, 16), np.float32)
    np.savez(tmp_path / "in.npz", X=x)
    result = run("check", str(p), "--inputs", str(tmp_path / "in.npz"), "--json")
    doc = json.loads(result.output)
    assert doc["inputs"]["X"] == {"shape": [5, 16], "dtype": "float32", "source": "given"}
    np.savez(tmp_path / "bad.npz", Z=x)
    result = run("check", str(p), "--inputs", str(tmp_path / "bad.npz"))
    assert result.exit_code == 2 and result.output.count("\n") == 1


def test_invalid_model_fails_structure():
    report = check("models/invalid_dq21_block_scale_shape.onnx")
    assert not report.passed and not report.structure.passed
    assert report.exit_code == 1


def test_ir14_model_runs_on_onnxruntime_with_note(tmp_path):
    """IR 14 runs on every onnxruntime: given as the lowest IR the model needs where the
    installed one (probed) stops at 13, as it is where it loads 14."""
    from dqtool.runtimes import onnxruntime as ort_facts

    m = dq_model(np.arange(6, dtype=np.int8), np.array(0.1, np.float32), ir_version=14)
    report = check(save(m, tmp_path / "m.onnx"))
    assert report.passed and report.nodes[0].status == "bit-exact"
    lowered = any("IR version 14 given to onnxruntime as" in n for n in report.notes)
    assert lowered == (ort_facts.probe().max_ir_version < 14)


@pytest.mark.parametrize("args", [["check", "missing.onnx"],
                                  ["check", "models/qdq_conv_int8.onnx", "--shape", "X"],
                                  ["check", "models/qdq_conv_int8.onnx", "--against",
                                   "models/qdq_matmul_uint8.onnx"]])
def test_bad_input_exits_2_with_one_line(args):
    result = run(*args)
    assert result.exit_code == 2
    assert result.output.startswith("dqtool: error:") and result.output.count("\n") == 1


def test_in_memory_models(tmp_path):
    w, s = weights()
    m = matmul_model(w, s)
    assert check(m, against=onnx.ModelProto.FromString(m.SerializeToString())).passed


# Typos and bad values are refused with one line and exit 2, never ignored or a traceback.


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    err = result.stderr
    assert err.startswith("dqtool: error:") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def sym(tmp_path):
    """X[batch, 16] @ DQ(W) — one input with a symbolic dimension."""
    return str(save(matmul_model(*weights()), tmp_path / "m.onnx"))


def test_unknown_shape_name_is_refused_and_known_names_listed(sym):
    _one_line_error(run("check", sym, "--shape", "nosuch=1,2"),
                    "nosuch", "inputs: X", "symbolic dimensions: batch")
    _one_line_error(run("check", "models/qdq_conv_int8.onnx", "--shape", "nosuch=1,2"),
                    "nosuch", "inputs: X", "symbolic dimensions: none")
    # A symbolic dimension is one size; an input's whole shape still works by its name.
    _one_line_error(run("check", sym, "--shape", "batch=2,3"), "batch", "one size")
    assert run("check", sym, "--shape", "batch=3").exit_code == 0
    with pytest.raises(UsageError, match="batxh"):
        check(sym, shapes={"batxh": (2,)})


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--rtol", "-1"], ["--atol", "-0.5"]])
def test_out_of_range_numbers_are_click_usage_errors(sym, args):
    result = run("check", sym, *args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '{args[0]}'" in result.stderr


def test_nan_tolerance_and_negative_seed_refused(sym):
    _one_line_error(run("check", sym, "--rtol", "nan"), "--rtol", "non-negative")
    for kw in ({"rtol": float("nan")}, {"atol": -1.0}, {"seed": -1}):
        with pytest.raises(UsageError):
            check(sym, **kw)


def test_huge_shape_refused_not_allocated(sym):
    _one_line_error(run("check", sym, "--shape", "batch=100000000000"), "input X",
                    "--shape")


def _npz(tmp_path, name, **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def test_bad_inputs_files_exit_2_with_one_line(sym, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 16), np.float32))
    (tmp_path / "text.npz").write_text("not a zip\n")
    (tmp_path / "folder.npz").mkdir()
    f32 = np.float32
    cases = [
        (str(tmp_path / "missing.npz"), ["missing.npz", "no such file"]),
        (str(tmp_path / "x.npy"), ["x.npy", "not an .npz"]),
        (str(tmp_path / "text.npz"), ["text.npz", "not an .npz"]),
        (str(tmp_path / "folder.npz"), ["folder.npz", "directory"]),
        (_npz(tmp_path, "names.npz", Z=np.zeros((2, 16), f32)), ["Z", "inputs: X"]),
        (_npz(tmp_path, "dtype.npz", X=np.zeros((2, 16))), ["X", "float64", "float32"]),
        (_npz(tmp_path, "rank.npz", X=np.zeros((2, 16, 1), f32)), ["X", "3 dimensions"]),
        (_npz(tmp_path, "dim.npz", X=np.zeros((2, 15), f32)), ["X", "dimension 1 to 16"]),
    ]
    for path, needles in cases:
        _one_line_error(run("check", sym, "--inputs", path), *needles)
    ok = _npz(tmp_path, "ok.npz", X=np.zeros((2, 16), f32))
    assert run("check", sym, "--inputs", ok).exit_code == 0
    _one_line_error(run("check", sym, "--inputs", ok, "--shape", "X=3,16"), "--shape X")


def test_raw_byte_npz_arrays_read_as_the_input_type(tmp_path):
    # numpy.savez stores ml_dtypes arrays as void bytes; they come back as the input's type.
    spec = InputSpec("X", "bfloat16", (2,))
    path = _npz(tmp_path, "bf.npz", X=np.array([1.5, -2], ml_dtypes.bfloat16))
    got = check_given(spec, load_npz(path)["X"])
    assert got.dtype == ml_dtypes.bfloat16 and got.tolist() == [1.5, -2]


def test_runtime_failure_is_one_line_and_keeps_the_whole_message():
    """The message is one line of at most 300 characters; ``detail`` keeps onnxruntime's
    whole text. The model: a DequantizeLinear one opset above what the installed
    onnxruntime runs (probed), a CPU kernel that is missing (float4e2m1 x) if it runs every
    opset onnx knows."""
    import onnx

    from dqtool.checking import runners
    from dqtool.runtimes import onnxruntime as ort_facts

    facts = ort_facts.probe()
    if facts.max_opset < onnx.defs.onnx_opset_version():
        model = ort_facts._dq_model(facts.max_opset + 1)
    else:
        model = ort_facts._dq_model(facts.max_opset, x_type="float4e2m1")
    with pytest.raises(runners.RuntimeFailure) as info:
        runners.run_ort(model, {})
    e = info.value
    assert len(str(e)) <= 300 and "\n" not in str(e)
    assert len(e.detail) >= len(str(e).rstrip(".…")) and e.detail.split()[0] in str(e)
    assert runners.RuntimeFailure("short").detail == "short"


def test_why_onnxruntime_cannot_run_comes_from_the_profile():
    from dqtool.runtimes import onnxruntime as ort_facts

    old, new = ort_facts.FIXED["1.31"], ort_facts.FIXED["1.32"]
    at27 = ort_facts._dq_model(27)
    assert ort_facts.why_cannot_run(at27, old) == (
        "onnxruntime 1.31 CPU runs DequantizeLinear up to ai.onnx opset 26 (measured on "
        "onnxruntime 1.31.1); the model is opset 27")
    assert ort_facts.why_cannot_run(at27, new) is None
    ir14 = ort_facts._dq_model(21, ir_version=14)
    assert ort_facts.why_cannot_run(ir14, old) == (
        "onnxruntime 1.31 CPU loads IR versions up to 13 (measured on onnxruntime 1.31.1); "
        "the model is IR 14")
    assert ort_facts.why_cannot_run(ir14, new) is None


def test_an_input_it_cannot_generate_names_the_file(tmp_path):
    path = tmp_path / "strings.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
        g (string[2] x) => (string[2] y) { y = Identity(x) }"""), path)
    r = CliRunner().invoke(cli, ["check", str(path)], env=ENV)
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"dqtool: error: {path}: input 'x' is STRING, which dqtool cannot "
                        "generate; give it with --inputs (numpy.savez(path, x=an array of "
                        "str))\n")


def _strings_model(tmp_path):
    """A string input passed through beside a weight's DequantizeLinear (a tokenizer-in-
    graph model's shape), and its upgrade."""
    src = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 7, opset_import: ["" : 13]>
        g (string[2] s, float[1,4] x) => (string[2] t, float[1,4] y) {
            t = Identity(s)
            w = Constant <value = int8[4,4] {-8,-7,-6,-5,-4,-3,-2,-1,0,1,2,3,4,5,6,7}> ()
            sc = Constant <value = float {0.5}> ()
            wf = DequantizeLinear(w, sc)
            y = MatMul(x, wf)
        }"""), src)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(str(src), 21, str(up))
    return src, up


def test_string_inputs_given_with_inputs_are_fed_and_string_outputs_compared(tmp_path):
    src, up = _strings_model(tmp_path)
    np.savez(tmp_path / "in.npz", s=np.array(["Hello", "wörld"]))
    r = CliRunner().invoke(cli, ["check", str(up), "--against", str(src), "--inputs",
                                 str(tmp_path / "in.npz"), "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["inputs"]["s"] == {"shape": [2], "dtype": "string", "source": "given"}
    runs = {c["runtime"]: c for c in doc["comparisons"]}
    assert set(runs) == {"onnxruntime", "reference"}
    for run in runs.values():
        assert run["skipped"] is None and run["passed"]
        t = next(o for o in run["outputs"] if o["name"] == "t")
        assert t["passed"] and t["dtype"] == "string" and t["mismatched"] == 0
        assert t["size"] == 2


def test_a_string_input_given_as_numbers_is_refused_by_name(tmp_path):
    _, up = _strings_model(tmp_path)
    np.savez(tmp_path / "in.npz", s=np.array([1.0, 2.0]))
    r = CliRunner().invoke(cli, ["check", str(up), "--inputs", str(tmp_path / "in.npz")],
                           env=ENV)
    assert r.exit_code == 2, r.output
    assert "--inputs s: float64 array, the model takes string" in r.stderr


def test_string_inputs_given_as_bytes_are_read_as_utf8_or_refused(tmp_path):
    src, up = _strings_model(tmp_path)
    np.savez(tmp_path / "ok.npz", s=np.array(["wörld".encode(), b"a"]))
    r = CliRunner().invoke(cli, ["check", str(up), "--against", str(src), "--inputs",
                                 str(tmp_path / "ok.npz")], env=ENV)
    assert r.exit_code == 0, r.output
    np.savez(tmp_path / "bad.npz", s=np.array([b"\xff\xfe", b"a"]))
    r = CliRunner().invoke(cli, ["check", str(up), "--inputs", str(tmp_path / "bad.npz")],
                           env=ENV)
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "not UTF-8 text" in r.stderr


def test_string_outputs_that_differ_fail_with_the_first_difference():
    from dqtool.checking import compare

    got = compare.compare("t", np.array(["a", "b", "c"], dtype=object),
                          np.array(["a", "x", "y"]))
    assert not got.passed and got.mismatched == 2 and got.worst_index == (1,)
    assert "2 of 3 strings differ, the first at [1]: 'b' against 'x'" in got.failure
    same = compare.compare("t", np.array([b"a", b"b"], dtype=object), np.array(["a", "b"]))
    assert same.passed and same.max_abs == 0
    assert compare.bit_identical(np.array(["a", "b"], dtype=object),
                                 np.array(["a", "b"], dtype=object).copy())
    assert not compare.bit_identical(np.array(["a", "b"], dtype=object),
                                     np.array(["a", "c"], dtype=object))


def _parsed(tmp_path, name: str, text: str):
    path = tmp_path / name
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def test_against_same_weights_through_a_transpose_are_identical_on_both_runtimes(tmp_path):
    """NumPy's MatMul sums in another order on a transposed view (2e-6 apart here); the
    reference runtime computes on contiguous copies, so only values matter."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    plain = onnx.parser.parse_model("""<ir_version: 7, opset_import: ["" : 13]>
        g (float[2, 64] x) => (float[2, 16] y) { y = MatMul(x, w) }""")
    plain.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    moved = onnx.parser.parse_model("""<ir_version: 7, opset_import: ["" : 13]>
        g (float[2, 64] x) => (float[2, 16] y) {
            w = Transpose<perm = [1, 0]>(wt)
            y = MatMul(x, w)
        }""")
    moved.graph.initializer.append(onnx.numpy_helper.from_array(np.ascontiguousarray(w.T),
                                                                "wt"))
    onnx.save(plain, tmp_path / "plain.onnx")
    onnx.save(moved, tmp_path / "moved.onnx")
    report = check(tmp_path / "moved.onnx", against=tmp_path / "plain.onnx")
    assert report.passed
    for comparison in report.comparisons:
        assert comparison.skipped is None
        assert [o.max_abs for o in comparison.outputs] == [0.0]


def test_against_skips_a_runtime_that_cannot_run_a_model(tmp_path):
    # com.microsoft Gelu: onnxruntime runs it, onnx's reference evaluator has no Gelu there.
    text = """<ir_version: 7, opset_import: ["" : 13, "com.microsoft" : 1]>
        g (float[2, 8] x) => (float[2, 8] y) { y = com.microsoft.Gelu(x) }"""
    a, b = _parsed(tmp_path, "a.onnx", text), _parsed(tmp_path, "b.onnx", text)
    result = run("check", str(a), "--against", str(b), "--json")
    doc = json.loads(result.output)
    assert result.exit_code == 0, result.output
    by_runtime = {c["runtime"]: c for c in doc["comparisons"]}
    assert by_runtime["onnxruntime"]["skipped"] is None
    assert by_runtime["onnxruntime"]["outputs"][0]["passed"]
    assert by_runtime["reference"]["skipped"].startswith("reference cannot run")


def test_against_fails_when_no_runtime_could_compare(tmp_path):
    text = """<ir_version: 7, opset_import: ["" : 13, "nowhere.known" : 1]>
        g (float[2] x) => (float[2] y) { y = nowhere.known.Thing(x) }"""
    a, b = _parsed(tmp_path, "a.onnx", text), _parsed(tmp_path, "b.onnx", text)
    result = run("check", str(a), "--against", str(b))
    assert result.exit_code == 1, result.output
    assert "no runtime could run both models" in result.output
    assert result.output.rstrip().endswith("FAILED")


def test_against_never_skips_the_reference_for_size(tmp_path, monkeypatch):
    """Past the streaming budget both runtimes still compare: node by node on the
    reference evaluator, in pieces on onnxruntime (docs/commands/check.md)."""
    from dqtool.checking import runners, stream_ort

    w, s = weights()
    p = save(matmul_model(w, s), tmp_path / "m.onnx")
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    monkeypatch.setattr(stream_ort, "PIECE_BYTES", 1)
    report = check(p, against=p)
    assert report.passed
    assert all(c.skipped is None and c.outputs for c in report.comparisons)


def test_check_alone_runs_a_weight_dq_by_itself(tmp_path, monkeypatch):
    """A DQ of constants is not exposed from the whole-model run (a large model's weights
    would all be held at once); it runs alone on both runtimes."""
    from dqtool.checking import runners

    w, s = weights()
    p = save(matmul_model(w, s), tmp_path / "m.onnx")
    exposed = []
    real = runners.run_ort
    monkeypatch.setattr(runners, "run_ort", lambda model, feeds, outputs=None, **k: (
        exposed.append([o.name for o in model.graph.output]) or real(model, feeds, outputs,
                                                                      **k)))
    report = check(p)
    assert report.passed and [n.status for n in report.nodes] == ["bit-exact"]
    whole, alone = exposed
    assert len(whole) == 1  # the model's own output only
    assert alone == ["y"]


def test_dequantized_bytes_count_initializer_and_constant_weights():
    from pathlib import Path

    from dqtool.checking import models as check_models

    model = onnx.load(Path(__file__).resolve().parent.parent / "models" /
                      "dq21_constant_nodes.onnx")
    # W1 from a Constant (8 x 6), W2 from an initializer (6 x 4): 4 bytes per element
    assert check_models.qdq_value_bytes(model) == 4 * (8 * 6 + 6 * 4)


def test_check_alone_of_a_model_without_nodes_to_compare_prints_no_empty_table(tmp_path):
    src = tmp_path / "float.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
g (float[2] x) => (float[2] y) { y = Relu (x) }"""), src)
    r = CliRunner().invoke(cli, ["check", str(src)], env={**ENV, "COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "nothing to compare" in r.output
    assert "┃ node" not in r.output and "status" not in r.output


def test_an_output_nan_everywhere_in_both_models_is_noted(tmp_path):
    """Equal (NaN against NaN), but nothing was compared: it fails unless accepted, and the
    note says so (a shipped decoder gave all-NaN logits on onnxruntime for the seeded
    inputs)."""
    src = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 7, opset_import: ["" : 13]>
        g (float[1,4] x) => (float[1,4] y, float[1,4] z) {
            w = Constant <value = int8[4,4] {-8,-7,-6,-5,-4,-3,-2,-1,0,1,2,3,4,5,6,7}> ()
            sc = Constant <value = float {0.5}> ()
            wf = DequantizeLinear(w, sc)
            z = MatMul(x, wf)
            one = Constant <value = float {1.0}> ()
            a = Abs(z)
            p = Add(a, one)
            n = Neg(p)
            y = Sqrt(n)
        }"""), src)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(str(src), 21, str(up))
    report = check(str(up), against=str(src))
    assert not report.passed
    failed = [(c.runtime, o.name) for c in report.comparisons for o in c.outputs
              if not o.passed]
    assert failed == [("onnxruntime", "y"), ("reference", "y")]
    assert all(o.compared_nothing for c in report.comparisons for o in c.outputs
               if o.name == "y")
    nan_notes = [n for n in report.notes if "NaN or ±inf in every element" in n]
    assert [n.split(":")[0] for n in nan_notes] == ["onnxruntime", "reference"]
    accepted = check(str(up), against=str(src), accept_nonfinite=True)
    assert accepted.passed and accepted.to_json()["comparisons"][0]["outputs"][0][
        "nonfinite_accepted"]
    assert all("'y'" in n for n in nan_notes)  # z is finite: no note


def test_integer_verdict_of_outputs_nan_in_both_is_not_beyond_a_step():
    from dqtool.checking import compare
    from dqtool.integer import numerics

    nan = np.full((2, 3), np.nan, np.float32)
    v = numerics._verdict("onnxruntime", compare.compare("y", nan, nan.copy()))
    assert v["within_budget"] and v["max_abs"] == 0 and v["max_expected"] == 0
    off = numerics._verdict("onnxruntime", compare.compare(
        "y", np.array([1.0, np.nan], np.float32), np.array([1.5, np.nan], np.float32)))
    assert not off["within_budget"]


def test_against_fails_a_checked_model_the_standard_forbids_even_when_runtimes_run_it(
        tmp_path):
    """onnxruntime runs a DequantizeLinear-13 with a float16 scale (the standard takes float
    scales there): outputs equal, but the checked model is invalid, so the check fails
    (it passed until 2026-11-27, `105ea5e`: a downgrade's bug slipped through)."""
    from onnx import helper, numpy_helper

    def model(opset: int) -> onnx.ModelProto:
        g = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["w", "sc"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])],
            [numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(4, 4), "w"),
             numpy_helper.from_array(np.array(0.5, np.float16), "sc")])
        return helper.make_model(g, ir_version=8,
                                 opset_imports=[helper.make_opsetid("", opset)])

    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(model(19), good)
    onnx.save(model(13), bad)
    assert check(str(good), against=str(good)).passed
    report = check(str(bad), against=str(good))
    assert any(c.skipped is None and c.passed for c in report.comparisons)  # runs alike
    assert not report.passed and "x_scale" in report.structure.onnx_checker
    r = CliRunner().invoke(cli, ["check", str(bad), "--against", str(good), "--json"], env=ENV)
    assert r.exit_code == 1
    assert json.loads(r.stdout)["structure"]["passed"] is False


def test_against_does_not_count_an_invalid_node_the_original_has_too(tmp_path):
    """A conversion of an invalid model carries its invalid node over: the check judges
    the conversion, so the structure failure is shown with the original's, not counted."""
    from helpers import MODELS

    src = MODELS / "invalid_ort_axis_opset11.onnx"
    out = tmp_path / "packed.onnx"
    dqtool.pack(str(src), str(out))
    report = check(str(out), against=str(src))
    assert report.passed and not report.structure.valid
    assert report.structure.inherited.startswith("onnx checker: ")
    r = CliRunner().invoke(cli, ["check", str(out), "--against", str(src)], env=ENV)
    assert r.exit_code == 0 and "not counted: the original fails too" in r.output

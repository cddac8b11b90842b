"""check --against: fused weights compared bit for bit, outputs with tolerance statistics."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.fused import in_function, nbits_inputs, nbits_model

import dqtool
from dqtool.cli import cli
from dqtool.families.fused import packing


def _save(proto_or_model, path):
    if isinstance(proto_or_model, ir.Model):
        ir.save(proto_or_model, path)
    else:
        onnx.save(proto_or_model, path)
    return path


@pytest.mark.parametrize(("zp", "dtype", "how"), [("packed", np.float32, "upgrade"),
                                                  ("float", np.float16, "upgrade"),
                                                  ("none", np.float32, "fold"),
                                                  ("packed", np.float32, "pack")])
def test_weights_bit_identical_after_each_rewrite(tmp_path, zp, dtype, how):
    rng = np.random.default_rng(0)
    original = nbits_model(300, 16, 4, 32, nbits_inputs(rng, 300, 16, 4, 32, dtype, zp),
                           dtype=dtype, m=4)
    src = _save(original, tmp_path / "m.onnx")
    m = ir.serde.deserialize_model(original)
    if how == "fold":
        converted = dqtool.fold(m).model
    else:
        converted = dqtool.upgrade(m, 21).model
        if how == "pack":
            converted = dqtool.pack(converted).model
    out = _save(converted, tmp_path / "c.onnx")
    report = dqtool.check(out, against=src, rtol=1e-2)
    assert [w.status for w in report.weights] == ["bit-identical"]
    assert report.passed
    doc = report.to_json()
    assert doc["weights"][0]["node"] == "mm"
    # the output statistics are there whatever they are (MatMulNBits sums in its own order)
    assert doc["comparisons"][0]["outputs"][0]["max_abs"] is not None


def test_a_changed_weight_fails(tmp_path):
    rng = np.random.default_rng(1)
    inputs = nbits_inputs(rng, 64, 8, 4, 32)
    src = _save(nbits_model(64, 8, 4, 32, inputs), tmp_path / "m.onnx")
    converted = dqtool.upgrade(ir.load(src), 21).model
    x = converted.graph.initializers["mm/scale"]
    x.const_value = ir.tensor(x.const_value.numpy() * np.float32(1.5), name="mm/scale")
    out = _save(converted, tmp_path / "c.onnx")
    r = CliRunner().invoke(cli, ["check", str(out), "--against", str(src), "--rtol", "1"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 1
    assert "weight of mm (MatMulNBits): differ" in r.output


@pytest.mark.parametrize("change", [None, "scales"])
def test_packed_against_its_qdq_original_compares_the_packed_weights(tmp_path, change):
    # The conversion the other way (DequantizeLinear + MatMul -> MatMulNBits): the packed
    # model's fused weights against the original's, and onnxruntime's own sum order judged
    # against its bound. Without that, exact packs failed on 1-2 ulp differences.
    rng = np.random.default_rng(7)
    fused = nbits_model(40, 6, 4, 16, nbits_inputs(rng, 40, 6, 4, 16), m=1)  # ORT sums differ
    qdq = dqtool.upgrade(ir.serde.deserialize_model(fused), 21).model
    src = _save(qdq, tmp_path / "qdq.onnx")
    packed = dqtool.pack(ir.load(src)).model
    if change == "scales":
        v = next(v for v in packed.graph.initializers.values() if "scale" in v.name)
        v.const_value = ir.tensor(v.const_value.numpy() * np.float32(1.001), name=v.name)
    out = _save(packed, tmp_path / "packed.onnx")
    report = dqtool.check(out, against=src)
    statuses = [w.status for w in report.weights]
    if change is None:
        assert statuses == ["bit-identical"] and report.passed
        # onnxruntime 1.32 sums this one in another order (1 ulp): the bound passes it
        if report.comparisons[0].outputs[0].max_abs > 0:
            assert [b.status for b in report.bounds] == ["within"]
    else:
        assert statuses == ["differ"] and not report.passed


def test_upgrade_check_compares_fused_weights_and_tolerates_the_sum_order(tmp_path):
    rng = np.random.default_rng(2)
    src = _save(nbits_model(1024, 64, 4, 32, nbits_inputs(rng, 1024, 64, 4, 32), m=8),
                tmp_path / "m.onnx")
    report = dqtool.upgrade(src, 21, tmp_path / "u.onnx", check=True)
    assert report.check.ok
    assert "1 fused weight(s) (MatMulNBits / GatherBlockQuantized) bit-identical in the " \
           "converted model" in report.check.notes
    # Before: onnxruntime's sums in another order failed the check ("DIFFERENT: Y: ...").
    ort_verdict = report.check.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"]
    assert ort_verdict == "identical" or ort_verdict.startswith(
        "fused weights identical; final Y: ")
    assert report.check.runtimes["dqtool.reference_evaluator"] == "identical"


# ---- the verdict: weights bit-identical + reference identical + onnxruntime within bound ----

def _fp16_pair(tmp_path, *, bias=False, k=256, n=64, m=8):
    """The issue's case: float16 MatMulNBits (K=256, N=64, block 32, 4 bits, fp16 scales),
    upgraded to opset 21; onnxruntime's outputs of the two differ in their last bits."""
    rng = np.random.default_rng(0)
    b = (rng.standard_normal(n) * 0.5).astype(np.float16) if bias else None
    original = nbits_model(k, n, 4, 32, nbits_inputs(rng, k, n, 4, 32, np.float16, "packed"),
                           dtype=np.float16, m=m, bias=b)
    src = _save(original, tmp_path / "orig.onnx")
    up = _save(dqtool.upgrade(ir.load(src), 21).model, tmp_path / "up.onnx")
    return src, up


def _sums_in_float16() -> bool:
    """onnxruntime on this CPU's path sums a float16 MatMulNBits in float16
    (``code_paths``: neon-fp16-matmulnbits, measured on arm64-dotprod)."""
    from dqtool.checking import path_deviations

    return any(d.key == "neon-fp16-matmulnbits"
               for d in path_deviations.for_op("com.microsoft:MatMulNBits"))


def _cli_check(*args):
    return CliRunner().invoke(cli, ["check", *map(str, args)], env={"COLUMNS": "200"})


def test_a_correct_float16_upgrade_passes_with_the_difference_shown(tmp_path):
    src, up = _fp16_pair(tmp_path)
    report = dqtool.check(up, against=src)
    ort_cmp = next(c for c in report.comparisons if c.runtime == "onnxruntime")
    ref_cmp = next(c for c in report.comparisons if c.runtime == "reference")
    y = ort_cmp.outputs[0]
    # onnxruntime's sums differ (the difference is reported, not hidden) ...
    assert y.max_abs > 0 and y.mismatched > 0
    # ... and tolerated, with the reason, because the proof holds:
    assert y.passed and y.tolerated and "fused weight(s) bit-identical" in y.tolerated
    assert ref_cmp.outputs[0].max_abs == 0  # the reference runtime: bit for bit
    assert [w.status for w in report.weights] == ["bit-identical"]
    [bound] = report.bounds
    assert bound.status == "within" and bound.max_abs == y.max_abs
    assert 0 < bound.max_ratio <= 1
    assert report.passed and report.exit_code == 0
    # the saved report, re-judged, keeps the reason
    doc = report.to_json()
    again = dqtool.checking.compare.OutputComparison.from_json(
        doc["comparisons"][0]["outputs"][0])
    assert again.passed and again.tolerated == y.tolerated
    assert doc["bounds"][0]["status"] == "within"
    r = _cli_check(up, "--against", src)
    assert r.exit_code == 0, r.output
    assert "yes (bound)" in r.output
    assert "onnxruntime, fused node mm (MatMulNBits): max abs" in r.output
    assert "within its rounding bound" in r.output
    assert r.output.rstrip().endswith("PASSED")


@pytest.mark.parametrize("how", ["upgrade", "pack", "fold"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_correct_conversions_pass(tmp_path, how, dtype):
    rng = np.random.default_rng(3)
    b = (rng.standard_normal(48) * 0.5).astype(dtype)
    original = nbits_model(512, 48, 4, 32, nbits_inputs(rng, 512, 48, 4, 32, dtype, "packed"),
                           dtype=dtype, m=8, bias=b)
    src = _save(original, tmp_path / "m.onnx")
    m = ir.load(src)
    converted = dqtool.fold(m).model if how == "fold" else dqtool.upgrade(m, 21).model
    if how == "pack":
        converted = dqtool.pack(converted).model
    out = _save(converted, tmp_path / "c.onnx")
    report = dqtool.check(out, against=src)
    assert report.passed, report.to_json()
    assert [w.status for w in report.weights] == ["bit-identical"]
    ort_out = report.comparisons[0].outputs[0]
    assert ort_out.max_abs is not None  # shown whether zero or not
    assert all(b.status == "within" for b in report.bounds)


def _tamper(path, out, how):
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    nodes = {n.op_type: n for n in m.graph.node}
    if how == "scale one ulp":
        t = inits[nodes["DequantizeLinear"].input[1]]
        arr = onnx.numpy_helper.to_array(t).copy()
        arr.reshape(-1)[0] = np.nextafter(arr.reshape(-1)[0], np.float16(np.inf))
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    elif how == "zero point":
        t = inits[nodes["DequantizeLinear"].input[2]]
        arr = onnx.numpy_helper.to_array(t).copy()
        flat = arr.reshape(-1)
        flat[0] = (int(flat[0]) + 1) % 16
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    elif how == "no bias":
        add = nodes["Add"]
        mm = nodes["MatMul"]
        mm.output[0] = add.output[0]
        m.graph.node.remove(add)
    onnx.save(m, out)
    return out


@pytest.mark.parametrize("how", ["scale one ulp", "zero point", "no bias"])
def test_a_wrong_conversion_fails(tmp_path, how):
    src, up = _fp16_pair(tmp_path, bias=True)
    bad = _tamper(up, tmp_path / "bad.onnx", how)
    report = dqtool.check(bad, against=src)
    assert not report.passed and report.exit_code == 1
    ort_out = report.comparisons[0].outputs[0]
    if _sums_in_float16():  # this path's onnxruntime deviates: the reference decides
        assert "known deviation" in (ort_out.tolerated or "")
    else:
        assert not ort_out.passed and ort_out.tolerated is None
    if how == "no bias":
        # the weights are right; the node's output is not: beyond its bound, and the
        # reference runtime differs too
        assert [w.status for w in report.weights] == ["bit-identical"]
        assert [b.status for b in report.bounds] == ["beyond"]
        assert not report.comparisons[1].passed
    else:
        assert [w.status for w in report.weights] == ["differ"]
    r = _cli_check(bad, "--against", src)
    assert r.exit_code == 1
    assert "judged by --rtol/--atol only" in r.output
    assert r.output.rstrip().endswith("FAILED")


def test_explicit_tolerances_still_apply(tmp_path):
    src, up = _fp16_pair(tmp_path, bias=True)
    bad = _tamper(up, tmp_path / "bad.onnx", "scale one ulp")
    strict = dqtool.check(bad, against=src)
    diff = max(c.outputs[0].max_abs for c in strict.comparisons)
    # a weight that differs fails whatever the tolerance (the weights are the proof) ...
    assert not dqtool.check(bad, against=src, atol=diff).passed
    # ... while a correct conversion within the user's own atol needs no bound at all
    ok = dqtool.check(up, against=src, atol=1.0)
    assert ok.passed and ok.bounds == () and ok.comparisons[0].outputs[0].tolerated is None


def test_a_large_node_is_bounded_on_a_sample_of_columns(tmp_path, monkeypatch):
    from dqtool.families.fused import bound

    src, up = _fp16_pair(tmp_path)  # K=256, N=64, 8 rows of A
    monkeypatch.setattr(bound, "WORK", 8 * 256 * 16)  # 16 columns' worth
    report = dqtool.check(up, against=src)
    [b] = report.bounds
    assert b.status == "within"
    assert b.sampled == "sampled: 16 of 64 output columns (every row)"
    assert report.passed


def test_one_row_of_a_is_bounded_on_every_column(tmp_path, monkeypatch):
    from dqtool.families.fused import bound

    src, up = _fp16_pair(tmp_path, m=1)  # a sequence of one token
    monkeypatch.setattr(bound, "WORK", 256 * 16)  # would sample 16 columns of more rows
    seen = []
    real = bound._weight_columns
    monkeypatch.setattr(bound, "_weight_columns",
                        lambda node, cols: seen.append(len(cols)) or real(node, cols))
    report = dqtool.check(up, against=src)
    [b] = report.bounds  # onnxruntime's outputs differ in their last bits: bounded
    assert b.sampled is None and seen == [64]
    assert report.passed


def test_upgrade_check_of_a_float16_bias_node_is_identical_on_the_reference(tmp_path):
    # the reference MatMulNBits is its decomposition: the converted graph (MatMul, then the
    # bias Add, each rounding to float16) matches it bit for bit; only onnxruntime's fused
    # kernel may differ, and only there is a difference tolerated
    src, _ = _fp16_pair(tmp_path, bias=True)
    report = dqtool.upgrade(src, 21, tmp_path / "u.onnx", check=True)
    assert report.check.ok
    assert report.check.runtimes["dqtool.reference_evaluator"] == "identical"


def test_the_bound_is_the_stated_formula():
    from dqtool.families.fused import bound

    rng = np.random.default_rng(12)
    k, n = 64, 4
    inputs = nbits_inputs(rng, k, n, 4, 32)
    node = ir.serde.deserialize_model(nbits_model(k, n, 4, 32, inputs, m=1)).graph.node(0)
    w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                       K=k, N=n, bits=4, block_size=32).astype(np.float64)
    a = rng.standard_normal((1, k)).astype(np.float32)
    y = (a.astype(np.float64) @ w).astype(np.float32)
    u = 2.0 ** -24
    gamma = k * u / (1 - k * u)
    s = np.abs(a.astype(np.float64)) @ np.abs(w)
    per_side = gamma * s + u * np.abs(y.astype(np.float64)) / (1 - u) + 2.0 ** -150
    expected = 2 * per_side  # both models, the same A, no bias, float32: no weight term
    j = int(np.argmin(expected))
    for factor, status in ((0.99, "within"), (1.01, "beyond")):
        y2 = y.copy()
        y2[0, j] = np.float32(float(y[0, j]) + factor * expected[0, j])
        got = bound._matmul_bound(node, None, a, a, y, y2)
        assert got.status == status, (factor, got)
        moved = abs(float(y2[0, j]) - float(y[0, j]))
        # the products |a|·|w| are bounded from above through float32 (_products_above):
        # the bound is the formula's, looser by at most (1 + 2^-23)/(1 - γ_K) - 1 ≈ 4e-6
        assert moved / expected[0, j] * (1 - 8e-6) <= got.max_ratio <= moved / expected[0, j]
    # a difference in A is carried through |W|
    a2 = a.copy()
    a2[0, 0] += np.float32(0.5)
    got = bound._matmul_bound(node, None, a, a2, y, y)
    assert got.status == "within" and got.max_ratio == 0.0


def test_upgrade_check_consults_the_bound(tmp_path, monkeypatch):
    from dqtool.families.fused import bound

    src, _ = _fp16_pair(tmp_path)
    ok = dqtool.upgrade(src, 21, tmp_path / "u.onnx", check=True)
    verdict = ok.check.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"]
    assert verdict.endswith("every fused node within its rounding bound)"), verdict
    # with a bound that allows no rounding at all, the same difference is beyond it
    monkeypatch.setattr(bound, "_ACC_U", 0.0)
    monkeypatch.setattr(bound, "_U", dict.fromkeys(bound._U, 0.0))
    monkeypatch.setattr(bound, "_ETA", dict.fromkeys(bound._ETA, 0.0))
    from dqtool.convert.report import CheckFailed

    if _sums_in_float16():  # beyond the bound where this onnxruntime deviates: the
        # reference evaluator decides, and the verdict says so
        check = dqtool.upgrade(src, 21, tmp_path / "u2.onnx", check=True).check
        verdict = check.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"]
        assert "BEYOND its rounding bound" in verdict and "known deviation" in verdict
        return
    with pytest.raises(CheckFailed) as failed:
        dqtool.upgrade(src, 21, tmp_path / "u2.onnx", check=True)
    check = failed.value.report.check
    verdict = check.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"]
    assert verdict.startswith("DIFFERENT: final Y: ") and "BEYOND its rounding bound" in verdict
    assert not check.ok and not (tmp_path / "u2.onnx").exists()


def test_indices_into_a_small_table_are_drawn_inside_it(tmp_path):
    # check drew indices in [-8, 8]: a table of 6 rows failed every run ("nothing compared").
    from helpers.fused import gbq_model

    from dqtool.checking.inputs import generate, index_bounds

    rng = np.random.default_rng(3)
    table = packing.pack(rng.integers(0, 16, size=(6, 32), dtype=np.uint8), 4)
    scales = (rng.random((6, 1)) + 0.5).astype(np.float32)
    original = gbq_model(table, scales, None, block=32, bits=4, n_indices=40)
    assert index_bounds(original) == {"indices": 6}
    feeds, _ = generate(original, seed=0)
    idx = feeds["indices"]
    assert idx.min() >= -6 and idx.max() <= 5 and len(set(idx.tolist())) > 6
    src = _save(original, tmp_path / "g.onnx")
    up = _save(dqtool.upgrade(ir.load(src), 21).model, tmp_path / "u.onnx")
    report = dqtool.check(up, against=src)
    assert report.passed and report.comparisons
    assert all(c.outputs for c in report.comparisons)


@pytest.mark.parametrize("keep", [False, True])
def test_upgrade_check_passes_a_fused_node_kept_for_its_computed_weight(tmp_path, keep):
    """A MatMulNBits whose B is a graph input stays as it is (upgrade keeps it, with the
    reason): --check found "not found (the original's weight is not constant)" and failed
    a correct conversion, even with --keep-contrib."""
    rng = np.random.default_rng(12)
    m = nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2)
    b = next(t for t in m.graph.initializer if t.name == "B")
    m.graph.input.append(onnx.helper.make_tensor_value_info("B", b.data_type, list(b.dims)))
    m.graph.initializer.remove(b)
    src = tmp_path / "b_input.onnx"
    onnx.save(m, src)
    report = dqtool.upgrade(src, 21, tmp_path / "up.onnx", check=True, keep_contrib=keep)
    assert report.check.ok
    weights = dqtool.check(tmp_path / "up.onnx", against=src).weights
    assert [(w.status, w.same) for w in weights] == [("kept", True)]



def test_a_difference_the_node_by_node_runs_do_not_show_is_not_tolerated():
    """The bounds come from runs that expose every fused node's values; onnxruntime 1.32
    gave a float16, accuracy_level 4 model other final outputs in a plain run (off by 4.4)
    than in those runs (0.04), and check called that its rounding. The same comparison
    is tolerated when those runs show the same difference, and not otherwise."""
    from dqtool.checking import bounded, compare
    from dqtool.checking.against import RuntimeComparison
    from dqtool.families.fused.bound import NodeBound
    from dqtool.families.fused.weights import WeightComparison

    want = np.array([1.0, 2.0], np.float32)
    got = np.array([1.0, 2.5], np.float32)
    comparisons = [RuntimeComparison("onnxruntime", (compare.compare("Y", got, want),)),
                   RuntimeComparison("reference", (compare.compare("Y", want, want),))]
    weights = [WeightComparison("mm", "MatMulNBits", "bit-identical")]
    bounds = [NodeBound("mm", "MatMulNBits", "within", max_abs=0.5, max_ratio=0.5)]

    def tolerated(exposed):
        notes: list[str] = []
        out = bounded.apply(comparisons, weights, bounds, notes, exposed)
        return out[0].passed, notes

    assert tolerated({"Y": 0.5})[0]
    ok, notes = tolerated({"Y": 0.04})
    assert not ok and "when the nodes' values are exposed" in notes[0]


def test_upgrade_check_does_not_tolerate_what_the_node_runs_do_not_show(tmp_path,
                                                                        monkeypatch):
    """The same for ``upgrade --check``: a final difference (made here, whatever this
    onnxruntime gives) is compared with the one in the runs behind the bounds."""
    from dqtool.checking import conversion
    from dqtool.families.fused import bound

    rng = np.random.default_rng(1)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2), src)
    real_diff, real_on = conversion._first_difference, conversion._on
    on_ort = []

    def on(name, *args, **kwargs):
        on_ort[:] = [name == conversion.ORT]
        return real_on(name, *args, **kwargs)

    monkeypatch.setattr(conversion, "_on", on)
    monkeypatch.setattr(conversion, "_first_difference", lambda names, a, b: (
        "Y: 4 bytes differ" if "Y" in names and on_ort == [True] else real_diff(names, a, b)))
    # the runs behind the bounds agree with the run compared: tolerated
    report = dqtool.upgrade(src, 21, tmp_path / "up.onnx", check=True)
    (ort,) = [v for v in report.check.verdicts if v.runtime.startswith("onnxruntime")]
    assert ort.status == "tolerated"
    # they do not: not tolerated
    monkeypatch.setattr(bound, "_max_abs", lambda a, b: 1.0)
    with pytest.raises(dqtool.convert.CheckFailed) as e:
        dqtool.upgrade(src, 21, tmp_path / "up2.onnx", check=True)
    assert "when the nodes' values are exposed" in str(e.value.report.check.describe())


def _keep_io_model(seed: int) -> onnx.ModelProto:
    """A float16 model with float32 inputs and outputs, as onnxconverter's keep_io_types
    writes one: Cast → MatMulNBits → Add (bias) → MatMulNBits → Cast."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16)]
    for i, (k, n, x, y) in enumerate(((96, 40, "x16", "m"), (40, 16, "a", "m2"))):
        w = nbits_inputs(rng, k, n, 4, 32, np.float16)
        inits += [numpy_helper.from_array(w[r], f"{r}{i}") for r in ("B", "scales",
                                                                     "zero_points")]
        nodes.append(helper.make_node(
            "MatMulNBits", [x, f"B{i}", f"scales{i}", f"zero_points{i}"], [y], name=f"mm{i}",
            domain="com.microsoft", K=k, N=n, bits=4, block_size=32))
        if i == 0:
            inits.append(numpy_helper.from_array(
                (rng.standard_normal(n) * 0.1).astype(np.float16), "bias"))
            nodes.append(helper.make_node("Add", ["m", "bias"], ["a"]))
    nodes.append(helper.make_node("Cast", ["m2"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 16])], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def test_float16_nodes_onnxruntime_computes_in_float32_do_not_fail_an_exact_conversion(
        tmp_path):
    """onnxruntime 1.32's CPU provider has no float16 MatMul or Add: its graph of the
    upgraded model computes Cast → MatMul → Add → MatMul in float32 and never rounds to
    float16 in between (its plain run differed by 0.0049, its runs with the values exposed,
    which round them, by 0.0039). check --against and upgrade --check failed exact
    conversions for that; the difference is now put down to onnxruntime's own graph,
    where that graph shows it (whatever a release does, the conversion passes)."""
    original = _keep_io_model(5)
    src = _save(original, tmp_path / "m.onnx")
    out = tmp_path / "u.onnx"
    report = dqtool.upgrade(src, 21, out, check=True)  # raised CheckFailed
    assert report.check.ok
    checked = dqtool.check(out, against=src)
    assert checked.passed, checked.notes
    assert [w.status for w in checked.weights] == ["bit-identical"] * 2
    ref = next(c for c in checked.comparisons if c.runtime == "reference")
    assert all(o.max_abs == 0 for o in ref.outputs)
    drift = [n for n in checked.notes if "when the nodes' values are exposed" in n]
    assert all("never rounds" in n and "x16" in n for n in drift), drift


def test_roundings_skipped_reads_onnxruntime_graph():
    """The values of the model onnxruntime's graph never makes: a float16 Cast's output it
    reads past, and values it computes in float32 under its own prefixed name."""
    from onnx import TensorProto, helper

    from dqtool.checking.runners import roundings_skipped

    def model(nodes):
        return helper.make_model(helper.make_graph(nodes, "g", [], []))

    mine = model([helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
                  helper.make_node("MatMul", ["x16", "w"], ["m"]),
                  helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT),
                  helper.make_node("Relu", ["y"], ["r"])])
    ran = model([helper.make_node("MatMul", ["x", "w32"], ["InsertedPrecisionFreeCast_m"]),
                 helper.make_node("Cast", ["InsertedPrecisionFreeCast_m"], ["y"], to=1),
                 helper.make_node("Relu", ["y"], ["r"])])
    assert roundings_skipped(mine, ran) == ["x16", "m"]
    assert roundings_skipped(mine, mine) == []


@pytest.mark.parametrize("named", [False, True])
def test_check_alone_does_not_fail_what_onnx_cannot_type(tmp_path, named):
    # A MatMulNBits inside a function: onnx's type inference cannot type the function's
    # output (it has no schema for MatMulNBits), and failed the Relu reading it, for a
    # model onnxruntime runs. The checker without inference passes; inference is named
    # as not counted. The weights are still checked bit for bit.
    rng = np.random.default_rng(5)
    proto = in_function(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2))
    for i, node in enumerate(proto.graph.node if named else []):  # onnx names them then
        node.name = f"n{i}"
    with pytest.raises(Exception, match=r"InferenceError|Input 0 expected"):
        onnx.checker.check_model(proto, full_check=True)
    src = _save(proto, tmp_path / "fn.onnx")
    doc = dqtool.check(str(src)).to_json()
    assert doc["structure"]["passed"] and doc["structure"]["onnx_checker"] == "passed"
    assert "com.microsoft:MatMulNBits" in doc["structure"]["onnx_inference"]
    assert doc["passed"] and doc["summary"]["bit-exact"] == 1
    r = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "200"}).invoke(cli, ["check", str(src)])
    assert r.exit_code == 0 and "type inference not counted" in r.output


def test_check_alone_still_fails_what_the_checker_refuses(tmp_path):
    # the same model with an error the checker finds without inference (an operator
    # ai.onnx has no such version of): FAILED, as before
    rng = np.random.default_rng(5)
    proto = in_function(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2),
                         after="NoSuchOp")
    src = _save(proto, tmp_path / "bad.onnx")
    doc = dqtool.check(str(src)).to_json()
    assert not doc["structure"]["passed"] and doc["structure"]["onnx_checker"] != "passed"
    # an inference error at a node that reads nothing computed from MatMulNBits (an Add
    # of float and int64 beside it): FAILED, though the model holds a MatMulNBits (review)
    from onnx import helper, numpy_helper

    beside = nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2)
    beside.graph.initializer.append(numpy_helper.from_array(np.ones((2, 64), np.int64), "I"))
    beside.graph.node.append(helper.make_node("Add", ["A", "I"], ["Z"], name="bad_add"))
    beside.graph.output.append(helper.make_tensor_value_info("Z", onnx.TensorProto.FLOAT,
                                                             [2, 64]))
    doc = dqtool.check(str(_save(beside, tmp_path / "beside.onnx"))).to_json()
    assert not doc["structure"]["passed"] and "bad_add" in doc["structure"]["onnx_checker"]
    # and a model of ai.onnx operators alone keeps inference counted
    plain = _save(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2),
                  tmp_path / "plain.onnx")
    assert dqtool.check(str(plain)).to_json()["structure"]["onnx_inference"] == "passed"

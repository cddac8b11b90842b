"""Non-Q/DQ ops across opsets (attribute ↔ constant input moves), --check reporting, and
the wording of refusals. Every conversion is compared bit for bit with dqtool's reference
evaluator and onnxruntime (CPU, ORT_DISABLE_ALL)."""

from __future__ import annotations

import json

import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers import MODELS, save

import dqtool
from dqtool.checking import conversion
from dqtool.cli import cli
from dqtool.convert import CheckFailed, ConversionRefused

ENV = {"NO_COLOR": "1", "COLUMNS": "200"}
BOTH = ("dqtool.reference_evaluator", "onnxruntime (CPU, ORT_DISABLE_ALL)")

LAYERNORM = """<ir_version: 8, opset_import: ["" : {opset}]>
g (float[3,8] x) => (float[3,8] y) {{
    [mean] mu = ReduceMean <axes = [-1]> (x)
    [sub] d = Sub(x, mu)
    [two] two = Constant <value = float {{2.0}}> ()
    [pow] p = Pow(d, two)
    [var] var = ReduceMean <axes = [-1]> (p)
    [sqrt] s = Sqrt(var)
    [div] y = Div(d, s)
}}"""

# Ops whose attributes become constant inputs between 11 and 21.
ATTRS_11 = """<ir_version: 7, opset_import: ["" : 11]>
g (float[4,6] x) => (float[1,6] a, float[2,6] b, float[2,6] b2, float[1,6] c, float[6] d,
                     float[1,4,6] e, float[4,6] f, float[2,3] g, float[4,6] h) {
    [rsum] a = ReduceSum <axes = [0]> (x)
    [split] b, b2 = Split <axis = 0, split = [2, 2]> (x)
    [rmax] c = ReduceMax <axes = [0], keepdims = 1> (x)
    [rl2] d = ReduceL2 <axes = [0], keepdims = 0> (x)
    [unsq] e = Unsqueeze <axes = [0]> (x)
    [sq] f = Squeeze <axes = [0]> (e)
    [st] st = Constant <value = int64[2] {1, 2}> ()
    [en] en = Constant <value = int64[2] {3, 5}> ()
    [slice] g = Slice(x, st, en)
    [stf] st_f = Constant <value = float {-0.5}> ()
    [enf] en_f = Constant <value = float {0.5}> ()
    [clip] h = Clip(x, st_f, en_f)
}"""


def _bit_identical(a, b) -> dict:
    """Every output byte-equal in both runtimes (conversion.compare alone tolerates final
    outputs that differ after identical Q/DQ results; these models have no Q/DQ)."""
    res = conversion.compare(onnx.load(a), onnx.load(b))
    assert res.ok, res
    assert all(res.runtimes[name] == "identical" for name in BOTH), res
    return res


def _ops(path) -> list[tuple[str, str, tuple[str, ...]]]:
    m = onnx.load(path)
    return [(n.name, n.op_type, tuple(sorted(a.name for a in n.attribute))) for n in m.graph.node]


@pytest.mark.parametrize("target", [18, 21, 25])
def test_decomposed_layernorm_upgrades_bit_identical(tmp_path, target):
    src = save(LAYERNORM.format(opset=13), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    report = dqtool.upgrade(src, target, out, check=True)
    for name in BOTH:
        assert report.check.runtimes[name] == "identical", report.check
    _bit_identical(src, out)
    m = onnx.load(out)
    assert m.opset_import[0].version == target
    names = [n.name for n in m.graph.node]
    assert names == ["mean", "sub", "two", "pow", "var", "sqrt", "div"]  # names kept
    means = [n for n in m.graph.node if n.op_type == "ReduceMean"]
    assert all(len(n.input) == 2 and not n.attribute for n in means)
    axes = [n.input[1] for n in means]
    assert len(set(axes)) == 2  # unique names
    inits = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in m.graph.initializer}
    assert all(inits[a] == [-1] for a in axes)
    assert not m.graph.value_info  # none added for the new constants
    onnx.checker.check_model(m, full_check=True)


@pytest.mark.parametrize("via", [13, 18, 21])
def test_round_trip_through_attribute_moves(tmp_path, via):
    src = save(ATTRS_11, tmp_path / "m.onnx")
    up, down = tmp_path / "up.onnx", tmp_path / "down.onnx"
    dqtool.upgrade(src, via, up, check=True)
    dqtool.downgrade(up, 11, down, check=True)
    _bit_identical(src, up)
    _bit_identical(src, down)
    # Back to the very same nodes and attributes; the constants made on the way are gone.
    assert _ops(down) == _ops(src)
    assert not onnx.load(down).graph.initializer
    assert not onnx.load(down).graph.value_info


def test_round_trip_13_18_13_reduce_and_split(tmp_path):
    src = save("""<ir_version: 7, opset_import: ["" : 13]>
        g (float[4,6] x) => (float[2,6] a, float[2,6] b, float[4] m, float[1,1] s) {
            [split] a, b = Split <axis = 0> (x)
            [mean] m = ReduceMean <axes = [1], keepdims = 0> (x)
            [ax] ax = Constant <value = int64[2] {0, 1}> ()
            [sum] s = ReduceSum <keepdims = 1> (x, ax)
        }""", tmp_path / "m.onnx")
    up, down = tmp_path / "up.onnx", tmp_path / "down.onnx"
    dqtool.upgrade(src, 18, up, check=True)
    dqtool.downgrade(up, 13, down, check=True)
    _bit_identical(src, down)
    assert _ops(down) == _ops(src)


def test_downgrade_split_18_without_num_outputs_and_constant_axes(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,6] x) => (float[1,6] a, float[3,6] b, float[4] m) {
            [sp] sp = Constant <value = int64[2] {1, 3}> ()
            [split] a, b = Split <axis = 0> (x, sp)
            [ax] ax = Constant <value = int64[1] {1}> ()
            [mean] m = ReduceMean <keepdims = 0> (x, ax)
        }""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    report = dqtool.downgrade(src, 13, out, check=True)
    for name in BOTH:
        assert report.check.runtimes[name] == "identical", report.check
    m = onnx.load(out)
    # The axes Constant is gone; Split (which takes 'split' as an input at 13 too) is as it was.
    assert [n.op_type for n in m.graph.node] == ["Constant", "Split", "ReduceMean"]
    assert list(m.graph.node[1].input) == ["x", "sp"]
    mean = m.graph.node[2]
    assert list(mean.input) == ["x"]
    assert onnx.helper.get_attribute_value(
        next(a for a in mean.attribute if a.name == "axes")) == [1]


def test_downgrade_drops_an_attribute_the_target_lacks_at_its_default(tmp_path):
    """Reshape-14 added allowzero (default 0, the old meaning). Going to 13 with it at 0
    the attribute goes: kept, the model was invalid (onnxruntime: "Unrecognized attribute:
    allowzero", the checker: "Bad node spec"; found in a shipped dynamic-int8 model)."""
    src = save("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,6] x) => (float[3,4] y) {
            [s] s = Constant <value = int64[2] {3, 4}> ()
            [r] y = Reshape <allowzero = 0> (x, s)
        }""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    report = dqtool.downgrade(src, 13, out, check=True)
    (change,) = [c for c in report.changes if c.status == "changed"]
    assert "allowzero" in change.how and "Reshape-13" in change.why
    m = onnx.load(out)
    assert [a.name for a in m.graph.node[1].attribute] == []
    onnx.checker.check_model(m, full_check=True)
    for name in BOTH:
        assert report.check.runtimes[name] == "identical", report.check


def test_downgrade_refuses_an_attribute_the_target_lacks_off_its_default(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,6] x) => (float[3,4] y) {
            [s] s = Constant <value = int64[2] {3, 4}> ()
            [r] y = Reshape <allowzero = 1> (x, s)
        }""", tmp_path / "m.onnx")
    with pytest.raises(ConversionRefused) as e:
        dqtool.downgrade(src, 13, tmp_path / "o.onnx")
    assert "allowzero" in str(e.value)
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(("text", "attr"), [
    ("""g (float[1,1,8,8] x) => (float[1,1,4,4] y) {
            [p] y = AveragePool <kernel_shape = [3, 3], dilations = [2, 2]> (x)
        }""", "dilations"),
    ("""g (float[2,3] x) => (float[2,3] y) {
            [e] e = Constant <value = int64[0] {}> ()
            [r] y = ReduceMean <noop_with_empty_axes = 1> (x, e)
        }""", "noop_with_empty_axes"),
])
def test_downgrade_refuses_an_attribute_set_that_the_target_has_not(tmp_path, text, attr):
    """Set off its default (dilations 2; a ReduceMean told to do nothing with no axes), the
    attribute has no equivalent below: refused. (onnx's converter let both through; for
    a review, a downgrade first dropped them, and the node then meant another thing.)"""
    src = save(f"""<ir_version: 8, opset_import: ["" : 19]>
        {text}""", tmp_path / "m.onnx")
    with pytest.raises(ConversionRefused) as e:
        dqtool.downgrade(src, 13, tmp_path / "o.onnx")
    assert f"attribute '{attr}' is " in str(e.value) and "has no such attribute" in str(e.value)


def test_downgrade_drops_casts_float8_attributes_whatever_their_value(tmp_path):
    # saturate only acts on float8 (and round_mode on float8/float4), types below 19 lacks
    src = save("""<ir_version: 9, opset_import: ["" : 19]>
        g (float[4] x) => (int8[4] y) {
            [c] y = Cast <to = 3, saturate = 0> (x)
        }""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    report = dqtool.downgrade(src, 13, out, check=True)
    assert any("saturate" in c.how for c in report.changes)
    m = onnx.load(out)
    assert [a.name for a in m.graph.node[0].attribute] == ["to"]
    onnx.checker.check_model(m, full_check=True)


def test_shared_constant_axes_kept_while_used(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,6] x) => (float[4] m, int64[1] k) {
            [ax] ax = Constant <value = int64[1] {1}> ()
            [mean] m = ReduceMean <keepdims = 0> (x, ax)
            [id] ax2 = Identity(ax)
            [shape] k = Shape(ax2)
        }""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    dqtool.downgrade(src, 13, out, check=True)
    assert "Constant" in [n.op_type for n in onnx.load(out).graph.node]


@pytest.mark.parametrize(("rows", "sizes"), [(6, None), (7, [3, 3, 1]), (5, [2, 2, 1])])
def test_split_num_outputs_down(tmp_path, rows, sizes):
    src = save(f"""<ir_version: 8, opset_import: ["" : 18]>
        g (float[{rows},2] x) => (float[?,2] a, float[?,2] b, float[?,2] c) {{
            [split] a, b, c = Split <axis = 0, num_outputs = 3> (x)
        }}""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    dqtool.downgrade(src, 13, out, check=True)
    _bit_identical(src, out)
    split = onnx.load(out).graph.node[0]
    assert not split.attribute or [a.name for a in split.attribute] == ["axis"]
    if sizes is None:
        assert list(split.input) == ["x"]
    else:
        init = onnx.load(out).graph.initializer[0]
        assert onnx.numpy_helper.to_array(init).tolist() == sizes


def test_split_num_outputs_unknown_size_refused(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[N,2] x) => (float[?,2] a, float[?,2] b) {
            [split] a, b = Split <axis = 0, num_outputs = 2> (x)
        }""", tmp_path / "m.onnx")
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(src, 13)
    assert "size of axis 0 of 'x' is unknown" in info.value.report.refusals[0].reason


def test_downgrade_runtime_axes_refused_readably(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,6] x, int64[1] ax) => (float[4] m) {
            [mean] m = ReduceMean <keepdims = 0> (x, ax)
        }""", tmp_path / "m.onnx")
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(src, 13)
    reason = info.value.report.refusals[0].reason
    assert "'axes' ('ax') is computed at run time" in reason
    assert "ReduceMean-13 needs it as an attribute" in reason


def test_upgrade_inside_function_uses_constant_node(tmp_path):
    src = save("""<ir_version: 8, opset_import: ["" : 13, "local" : 1]>
        g (float[3,8] x) => (float[3,1] y) {
            [call] y = local.F(x)
        }
        <domain: "local", opset_import: ["" : 13]>
        F (a) => (b) {
            [mean] b = ReduceMean <axes = [-1]> (a)
        }""", tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    dqtool.upgrade(src, 21, out, check=True)
    _bit_identical(src, out)
    fn = onnx.load(out).functions[0]
    assert [n.op_type for n in fn.node] == ["Constant", "ReduceMean"]
    assert fn.node[1].name == "mean" and len(fn.node[1].input) == 2


# --- --check reporting ------------------------------------------------------------------

def test_check_skips_runtime_that_lacks_the_opset(tmp_path):
    """--check to an opset the installed onnxruntime does not run a DequantizeLinear at (its
    probed profile says so): onnxruntime is skipped with the profile's reason, the reference
    evaluator vouches. A runtime that runs every opset onnx knows is simply compared."""
    import onnx

    from dqtool.runtimes import onnxruntime as ort_facts

    top = ort_facts.probe().max_opset
    opset = min(top + 1, onnx.defs.onnx_opset_version())
    r = CliRunner().invoke(cli, ["upgrade", "models/dq13_int8_per_axis.onnx", "--opset",
                                 str(opset), "--check", "-o", str(tmp_path / "o.onnx")], env=ENV)
    assert r.exit_code == 0, r.output
    assert "dqtool.reference_evaluator: identical" in r.stdout
    if opset > top:
        assert (f"skipped (onnxruntime {ort_facts.probe().release} CPU runs DequantizeLinear "
                f"up to ai.onnx opset {top}") in r.stdout
        assert f"the model is opset {opset}" in r.stdout
    else:
        assert "onnxruntime: identical" in r.stdout
    assert "{" not in r.stdout and "'ok'" not in r.output


def test_check_failure_is_readable(tmp_path):
    text = """<ir_version: 8, opset_import: ["" : 13]>
        g (int8[2,3] x) => (float[2,3] y) <float s = {{{s}}}> {{
            [dq] y = DequantizeLinear(x, s)
        }}"""
    a = ir.to_proto(ir.from_onnx_text(text.format(s=0.5)))
    b = ir.to_proto(ir.from_onnx_text(text.format(s=0.25)))
    res = conversion.compare(a, b)
    assert not res.ok
    lines = res.describe()
    assert any(line.startswith("dqtool.reference_evaluator: DIFFERENT") for line in lines)
    assert "onnx.checker: ok" in lines

    report = dqtool.convert.ConvertReport("m.onnx", "upgrade", 13, 21, check=res)
    msg = str(CheckFailed(report))
    assert msg.startswith("--check failed for m.onnx at opset 21: ")
    assert "DIFFERENT" in msg and "{" not in msg and "nothing written" in msg
    assert CheckFailed(report).exit_code == 1


def test_check_fails_when_nothing_compared():
    a = ir.to_proto(ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 13, "x": 1]>
        g (float[2,3] x) => (float[2,3] y) { y = x.Unknown(x) }"""))
    res = conversion.compare(a, a)
    assert not res.ok
    assert "nothing was compared" in res.error


def test_check_runs_like_dqtool_check(tmp_path, monkeypatch):
    """--check makes its inputs and its onnxruntime sessions the way dqtool check does:
    integers in [-8, 8], unknown dimensions 1, onnxruntime's log kept quiet (level 4)."""
    import onnxruntime as ort

    from dqtool.checking import inputs, runners

    src = save("""<ir_version: 8, opset_import: ["" : 13]>
        g (int32[N,3] x, int8[2,3] q) => (float[2,3] y, int32[N,3] z) <float s = {0.5}> {
            [dq] y = DequantizeLinear(q, s)
            [neg] z = Neg(x)
        }""", tmp_path / "m.onnx")
    fed, options = [], []
    real_ref, real_session = runners.reference_session, ort.InferenceSession

    def spy_ref(*args, **kwargs):
        session = real_ref(*args, **kwargs)

        def run(feeds, outputs=None):
            fed.append(dict(feeds))
            return session(feeds, outputs)

        return run

    def spy_session(model, so, *a, **k):
        options.append((so.log_severity_level, so.graph_optimization_level))
        return real_session(model, so, *a, **k)

    monkeypatch.setattr(runners, "reference_session", spy_ref)
    monkeypatch.setattr(ort, "InferenceSession", spy_session)
    report = dqtool.upgrade(src, 21, check=True)
    assert all(report.check.runtimes[name] == "identical" for name in BOTH), report.check
    want, _ = inputs.generate(onnx.load(src), seed=0)
    assert want["x"].shape == (1, 3) and want["q"].shape == (2, 3)
    assert len(fed) == 2 and all(f.keys() == want.keys() for f in fed)
    for f in fed:
        for k in want:
            assert f[k].dtype == want[k].dtype and (f[k] == want[k]).all()
            assert f[k].min() >= -8 and f[k].max() <= 8
    assert options == [(4, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)] * 2


def test_check_of_a_model_object_reads_its_external_data():
    """A model object loaded from a file with external data: --check reads the tensors
    from the folder they were loaded from (it used to run them without their data)."""
    model = ir.load(MODELS / "external_data" / "model.onnx")
    report = dqtool.downgrade(model, 19, check=True)
    assert report.check.ok, report.check
    assert all(not v.startswith(("skipped", "FAILED")) for v in
               report.check.runtimes.values()), report.check


def test_check_gives_onnxruntime_the_ir_version_it_loads(tmp_path):
    """An original written with IR version 14 (onnx 1.23's default) runs on onnxruntime with
    the lowest IR version its opsets need where the installed runtime (probed) stops below
    14, as in dqtool check; the check says so. A runtime that loads 14 gets it as it is."""
    from dqtool.runtimes import onnxruntime as ort_facts

    src = save(LAYERNORM.format(opset=13).replace("ir_version: 8", "ir_version: 14"),
               tmp_path / "m.onnx")
    report = dqtool.upgrade(src, 18, check=True)
    assert report.check.runtimes[BOTH[1]] == "identical", report.check
    top = ort_facts.probe().max_ir_version
    if top < 14:
        assert list(report.check.notes) == [
            "the original: IR version 14 given to onnxruntime as 7 (the lowest the model "
            f"needs; onnxruntime loads IR ≤ {top})"]
        assert "note: the original: IR version 14" in "\n".join(report.check.describe())
    else:
        assert not report.check.notes


def test_check_refuses_inputs_it_cannot_generate_as_bad_input(tmp_path):
    """An input type dqtool cannot generate is bad input (exit 2, one line), as in dqtool
    check; it used to be a ValueError with a traceback."""
    from dqtool.errors import InputError

    src = save("""<ir_version: 8, opset_import: ["" : 13]>
        g (string[2] x) => (string[2] y) { y = Identity(x) }""", tmp_path / "m.onnx")
    with pytest.raises(InputError, match="input 'x' is STRING, which dqtool cannot generate"):
        dqtool.upgrade(src, 21, check=True)
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "--check", "-o",
                                 str(tmp_path / "o.onnx")], env=ENV)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.stderr.startswith(f"dqtool: error: {src}: --check: input 'x'"), r.stderr
    assert not (tmp_path / "o.onnx").exists()


# --- messages ---------------------------------------------------------------------------

def test_wrong_direction_names_the_file(tmp_path):
    src = save(LAYERNORM.format(opset=13), tmp_path / "ln.onnx")
    r = CliRunner().invoke(cli, ["downgrade", str(src), "--opset", "19"], env=ENV)
    assert r.exit_code == 2
    assert str(src) in r.stderr and "is at ai.onnx opset 13" in r.stderr and f"{src}: " in r.stderr


@pytest.mark.parametrize(("target", "needle"), [
    (13, "int16 is not a quantized type of QuantizeLinear-13"),
    (20, "int16 is not a quantized type of QuantizeLinear at opset 20 (QuantizeLinear-19)"),
])
def test_refusal_names_the_target_version(target, needle):
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(MODELS / "ort_qdq_int16.onnx", target)
    reasons = [r.reason for r in info.value.report.refusals]
    assert any(needle in r for r in reasons), reasons


def test_no_value_info_added_and_json_domain_key(tmp_path):
    out = tmp_path / "o.onnx"
    r = CliRunner().invoke(cli, ["upgrade", str(MODELS / "dq13_int8_per_axis.onnx"),
                                 "--opset", "21", "-o", str(out), "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["opset_imports"] == {"ai.onnx": 21}
    before = {v.name for v in onnx.load(MODELS / "dq13_int8_per_axis.onnx").graph.value_info}
    assert {v.name for v in onnx.load(out).graph.value_info} == before


def test_value_info_kept_where_it_was(tmp_path):
    src = tmp_path / "vi.onnx"
    m = onnx.load(MODELS / "dq13_int8_per_axis.onnx")
    t = m.graph.initializer[0]
    m.graph.value_info.append(onnx.helper.make_tensor_value_info(t.name, t.data_type,
                                                                 list(t.dims)))
    onnx.save(m, src)
    dqtool.upgrade(src, 21, tmp_path / "o.onnx")
    assert [v.name for v in onnx.load(tmp_path / "o.onnx").graph.value_info] == [t.name]


# --- DequantizeLinear inside a model-local function -----------------------------------

def test_dq_in_function_downgrades(tmp_path):
    out = tmp_path / "o.onnx"
    report = dqtool.downgrade(MODELS / "dq_in_function.onnx", 19, out, check=True)
    for name in BOTH:
        assert report.check.runtimes[name] == "identical", report.check


FUNC_INT16 = """<ir_version: 10, opset_import: ["" : 21, "local" : 1]>
g (float[2,3] x) => (float[2,3] y, float[2,3] z) <int16[2,3] q1 = {1,2,3,4,5,6},
        int8[2,3] q2 = {1,2,3,4,5,6}, float s = {0.5}> {
    [c1] y = local.F(q1, s)
    [c2] z = local.F(q2, s)
}
<domain: "local", opset_import: ["" : 21]>
F (q, sc) => (out) {
    [dq] out = DequantizeLinear(q, sc)
}"""


def test_dq_in_function_unknown_type_is_said_without_none(tmp_path):
    src = save(FUNC_INT16, tmp_path / "m.onnx")
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(src, 19)
    reason = info.value.report.refusals[0].reason
    assert "'q' (function input of local.F) is int16 at some call site" in reason
    assert "DequantizeLinear-19" in reason
    assert "None" not in str(info.value) and "?" not in reason


def test_a_step_the_converter_leaves_alone_is_not_reported_as_changed(tmp_path):
    from onnx import TensorProto, helper


    node = helper.make_node("ReduceMean", ["x"], ["y"], name="rm", keepdims=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "rm13.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=7), path)
    report = dqtool.upgrade(path, 21, tmp_path / "rm21.onnx")
    assert report.to_json()["changed"] == []


@pytest.mark.parametrize(("text", "where"), [
    ("""<ir_version: 7, opset_import: ["" : 0]>
        g (int8[4] x) => (float[4] y) <float s = {0.5}> { y = DequantizeLinear(x, s) }""",
     ""),
    ("""<ir_version: 8, opset_import: ["" : 13, "local" : 1]>
        g (float[2] x) => (float[2] y) { y = local.F(x) }
        <domain: "local", opset_import: ["" : 0]>
        F (a) => (b) { b = Relu(a) }""", "function F "),
])
def test_ai_onnx_opset_0_is_bad_input(tmp_path, text, where):
    src = save(text, tmp_path / "op0.onnx")
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "-o",
                                 str(tmp_path / "o.onnx")], env=ENV)
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"dqtool: error: {src}: {where}declares ai.onnx opset 0, which does "
                        "not exist (opsets start at 1)\n")
    assert not (tmp_path / "o.onnx").exists()


def test_a_graph_out_of_topological_order_is_sorted_and_says_so(tmp_path):
    """onnxruntime's quantizer writes an If before the node that makes what its branches
    read; onnx's checker rejects that. The conversion puts the nodes in order."""
    import numpy as np
    from onnx import TensorProto, helper

    branch = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["b_out"], name="then_id")], "branch", [],
        [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("If", ["c"], ["y"], name="if0", then_branch=branch,
                         else_branch=branch),
        helper.make_node("DequantizeLinear", ["q", "s"], ["h"], name="dq"),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.array([3, -4], np.int8), "q"),
         onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    src = tmp_path / "unsorted.onnx"
    onnx.save(m, src)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(m)
    report = dqtool.upgrade(src, 21, tmp_path / "out.onnx")
    assert report.warnings == ["main graph: nodes put in topological order (If 'if0' read "
                               "'h' before the node that makes it)"]
    out = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(out, full_check=True)
    assert [n.name for n in out.graph.node] == ["dq", "if0"]
    import onnxruntime as ort

    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"c": np.array(True)})[0].tolist() == [1.5, -2.0]
    # a sorted model keeps its order and gets no such warning
    again = dqtool.upgrade(tmp_path / "out.onnx", 23, tmp_path / "out23.onnx")
    assert again.warnings == []


def test_a_graph_with_a_cycle_is_bad_input(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["b"], ["a"], name="n1"),
         helper.make_node("Relu", ["a"], ["b"], name="n2"),
         helper.make_node("Add", ["a", "x"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    src = tmp_path / "cycle.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=7), src)
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "-o",
                                 str(tmp_path / "o.onnx")], env=ENV)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"dqtool: error: {src}: main graph: the nodes form a cycle")
    assert not (tmp_path / "o.onnx").exists()


def test_a_function_constant_taking_its_tensor_from_the_caller(tmp_path):
    """A Constant whose value is a reference to the calling node's attribute has no
    tensor of its own: IR version and order checks pass over it."""
    import numpy as np
    from onnx import TensorProto, helper

    const = helper.make_node("Constant", [], ["k"])
    const.attribute.append(onnx.AttributeProto(name="value", ref_attr_name="kval",
                                               type=onnx.AttributeProto.TENSOR))
    fn = helper.make_function("local", "AddK", ["a"], ["o"],
                              [const, helper.make_node("Add", ["a", "k"], ["o"])],
                              [helper.make_opsetid("", 21)], attributes=["kval"])
    call = helper.make_node("AddK", ["wf"], ["y"], domain="local",
                            kval=onnx.numpy_helper.from_array(np.ones(4, np.float32)))
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq"), call], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(np.array([-2, 0, 1, 3], np.int8), "w"),
         onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    src = tmp_path / "refattr.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                  helper.make_opsetid("local", 1)],
                                functions=[fn], ir_version=10), src)
    report = dqtool.upgrade(src, 23, tmp_path / "up.onnx", check=True)
    assert report.check.ok, report.check
    assert report.to_ir_version == 11
    r = CliRunner().invoke(cli, ["fold", str(src), "-o", str(tmp_path / "f.onnx")], env=ENV)
    assert r.exit_code == 0, r.output


def test_downgrade_warns_when_an_untyped_value_meets_a_narrower_type_constraint(tmp_path):
    # MaxPool takes uint8 only from version 12. With q's type not recorded, the step to 10
    # cannot be verified: the report must say so instead of passing in silence (the model
    # written is invalid: onnxruntime refuses it).
    src = save(onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (uint8[1,1,4,4] a, uint8[1,1,4,4] b) => (float[1,1,2,2] y) <float s = {0.1}, uint8 z = {128}>
{
    q = com.microsoft.QLinearAdd (a, s, z, b, s, z, s, z)
    p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (q)
    y = DequantizeLinear (p, s, z)
}"""), tmp_path / "m.onnx")
    report = dqtool.downgrade(src, 10, tmp_path / "out.onnx")
    assert any("'q'" in w and "MaxPool" in w for w in report.warnings), report.warnings
    r = CliRunner().invoke(cli, ["downgrade", str(src), "--opset", "10", "-o",
                                 str(tmp_path / "cli.onnx")])
    assert "MaxPool" in r.output and "'q'" in r.output, r.output


def test_untyped_steps_of_many_nodes_are_one_warning_per_step(tmp_path):
    # Five Adds and one Mul reading values a com.microsoft op makes (their types not
    # recorded): one warning for the Adds (three named, two counted), and the Mul's with
    # its values, as for any node alone.
    gelus = "\n".join(f"    q{i} = com.microsoft.Gelu (x)" for i in range(5))
    adds = "\n".join(f"    [add{i}] a{i} = Add (q{i}, q{i})" for i in range(5))
    src = save(onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 14, "com.microsoft" : 1]>
g (float[4] x) => (float[4] m, float[4] a0, float[4] a1, float[4] a2, float[4] a3,
                   float[4] a4)
{{
{gelus}
{adds}
    [mul] m = Mul (q0, q1)
}}"""), tmp_path / "m.onnx")
    report = dqtool.downgrade(src, 13, tmp_path / "out.onnx")
    untyped = [w for w in report.warnings if "does not record" in w]
    assert untyped == [
        "5 Add nodes (add0, add1, add2 and 2 more): Add-14 → Add-13 allow different types "
        "and the model does not record the types they read or make: not verified (a type "
        "the target version lacks makes the model invalid; --check runs it)",
        "mul: Mul-14 → Mul-13 allow different types and the model does not record the type "
        "of 'q0', 'q1': not verified (a type the target version lacks makes the model "
        "invalid; --check runs it)"], report.warnings

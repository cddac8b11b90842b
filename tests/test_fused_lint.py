"""lint --target: fused ops flagged (DQ109) everywhere but onnxruntime, with the fix."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers.fused import gbq_model, nbits_inputs, nbits_model

import dqtool


@pytest.fixture
def fused_path(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32)), path)
    return path


@pytest.mark.parametrize("target", ["onnx-opset-21", "onnx-opset-17", "directml-fl6.2",
                                    "onednn-graph", "opmx"])
def test_non_onnxruntime_targets_flag_fused_ops(fused_path, target):
    report = dqtool.lint(fused_path, target=target)
    found = [f for f in report.findings if f.code == "DQ109"]
    assert len(found) == 1 and found[0].node == "mm" and found[0].severity == "error"
    assert found[0].op == "com.microsoft:MatMulNBits-1"  # was None in --json
    # an onnx-opset-N target's fix lands on N (upgrading to 21 for a target of 17 left
    # the target's other findings); a target with limits of its own on DequantizeLinear
    # gets the conversion whose result it runs (below)
    command = {"onnx-opset-17": "`dqtool downgrade --opset 17`",
               "onnx-opset-21": "`dqtool upgrade --opset 21`",
               "directml-fl6.2": "`dqtool downgrade --opset 20`",  # int8/uint8, per-axis
               "onednn-graph": "`dqtool upgrade --opset 21`",
               "opmx": "`dqtool upgrade --opset 21`"}[target]
    assert command in found[0].fix and "`dqtool fold`" in found[0].fix
    assert ("lints clean for" in found[0].fix) == (not target.startswith("onnx-opset"))
    assert report.exit_code == 1


@pytest.mark.parametrize("target", ["directml-fl6.2", "directml-fl6.0", "directml-fl6.3",
                                    "directml-fl3.0", "onednn-graph", "opmx"])
@pytest.mark.parametrize(("bits", "k", "zp", "block"), [
    (4, 64, "packed", 32), (4, 100, "none", 32), (8, 64, "none", 32), (2, 96, "packed", 32),
    (4, 64, "float", 32)])
def test_the_fix_for_a_target_with_its_own_limits_gives_a_model_it_runs(
        tmp_path, target, bits, k, zp, block):
    """DirectML, oneDNN Graph and opmx limit DequantizeLinear themselves (codes' type,
    blocks, zero points, ragged blocks): the fix named is one whose result the target
    runs, found by trying (an `upgrade --opset 21` said for DirectML FL6.2 left its
    errors), or fold alone when no conversion gives such a model."""
    rng = np.random.default_rng(bits * 1000 + k)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(k, 8, bits, block, nbits_inputs(rng, k, 8, bits, block, zp=zp)),
              path)
    [found] = [f for f in dqtool.lint(path, target=target).findings if f.code == "DQ109"]
    assert "`dqtool fold`" in found.fix
    commands = [c for c in found.fix.split("`")[1::2] if c != "dqtool fold"]
    out = tmp_path / "fixed.onnx"
    if not commands:
        return  # no DequantizeLinear form runs there: fold is the fix (checked elsewhere)
    (command,) = commands
    verb, _, opset, *rest = command.split()[1:]
    (dqtool.upgrade if verb == "upgrade" else dqtool.downgrade)(
        path, int(opset), out, per_axis=rest == ["--per-axis"])
    errors = [f for f in dqtool.lint(out, target=target).findings if f.severity == "error"]
    assert errors == []


def _apply_fix(path, fix: str, out) -> None:
    """Run the conversion a DQ109 fix names (its first command that is not fold)."""
    command = next(c for c in fix.split("`")[1::2] if c != "dqtool fold")
    verb, _, opset, *rest = command.split()[1:]
    (dqtool.upgrade if verb == "upgrade" else dqtool.downgrade)(
        path, int(opset), out, per_axis=rest == ["--per-axis"])


@pytest.mark.parametrize("target", ["directml-fl6.2", "onednn-graph"])
def test_one_fix_serves_every_fused_node_of_the_model(tmp_path, target):
    """Each node got the first command that suited it alone (a ragged two-block weight
    `upgrade --opset 20`, a one-block one `--per-axis`): a user who ran the first one
    still had the target's errors on the other node. The fix is now one command that
    every node's result lints clean with, where there is one."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(31)
    inits, nodes = [], []
    for i, (k, n, a, y) in enumerate(((200, 51, "A", "h"), (51, 24, "h", "Y"))):
        w = nbits_inputs(rng, k, n, 4, 128)
        inits += [numpy_helper.from_array(w[r], f"{r}{i}") for r in ("B", "scales",
                                                                     "zero_points")]
        nodes.append(helper.make_node("MatMulNBits", [a, f"B{i}", f"scales{i}",
                                                      f"zero_points{i}"], [y], name=f"mm{i}",
                                      domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=128))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 200])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 24])], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]), path)
    found = [f for f in dqtool.lint(path, target=target).findings if f.code == "DQ109"]
    assert len(found) == 2 and found[0].fix == found[1].fix
    _apply_fix(path, found[0].fix, tmp_path / "fixed.onnx")
    errors = [f for f in dqtool.lint(tmp_path / "fixed.onnx", target=target).findings
              if f.severity == "error"]
    assert errors == []


def test_the_miniature_keeps_the_number_of_blocks_modulo_8(tmp_path):
    """A table of 50 rows x 3 blocks lowered to per-axis rows has 150 rows, which opmx's
    int4x4 refuses; the miniature tried 2 blocks (20 rows, a multiple of 4) and named a
    fix that left the error."""
    rng = np.random.default_rng(32)
    table = rng.integers(-8, 8, size=(50, 70)).astype(ml_dtypes.int4)
    path = tmp_path / "g.onnx"
    onnx.save(gbq_model(table, (rng.random((50, 3)) + 0.5).astype(np.float32), None,
                        block=32, opset=21), path)
    [found] = [f for f in dqtool.lint(path, target="opmx").findings if f.code == "DQ109"]
    _apply_fix(path, found.fix, tmp_path / "fixed.onnx")  # a conversion is named
    errors = [f for f in dqtool.lint(tmp_path / "fixed.onnx", target="opmx").findings
              if f.severity == "error"]
    assert errors == []


@pytest.mark.parametrize("blocks", [1, 2, 3, 9, 10])
def test_the_miniature_keeps_one_block_or_several(tmp_path, blocks):
    """9 blocks became one in the miniature (blocks modulo 8), a per-axis weight: the fix
    found for it (`upgrade --opset 21`) left directml-fl6.0's error on the real, blocked
    one. The miniature keeps one block or several and the count modulo 8."""
    from dqtool.families.fused.lint_fix import _small

    k = blocks * 32
    small = -(-_small(k, 32) // 32)
    assert (small == 1) == (blocks == 1) and small % 8 == blocks % 8 and small <= 9
    rng = np.random.default_rng(blocks)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(k, 8, 8, 32, nbits_inputs(rng, k, 8, 8, 32), m=4), path)
    [found] = [f for f in dqtool.lint(path, target="directml-fl6.0").findings
               if f.code == "DQ109"]
    if [c for c in found.fix.split("`")[1::2] if c != "dqtool fold"]:
        _apply_fix(path, found.fix, tmp_path / "fixed.onnx")
        errors = [f for f in dqtool.lint(tmp_path / "fixed.onnx",
                                         target="directml-fl6.0").findings
                  if f.severity == "error"]
        assert errors == []


@pytest.mark.parametrize("target", [13, 17, 19, 21, 25])
def test_the_fix_of_an_opset_target_leaves_a_model_it_runs(fused_path, tmp_path, target):
    [found] = [f for f in dqtool.lint(fused_path, target=f"onnx-opset-{target}").findings
               if f.code == "DQ109"]
    verb = "downgrade" if target < 21 else "upgrade"
    assert f"`dqtool {verb} --opset {target}`" in found.fix
    out = tmp_path / "fixed.onnx"
    (dqtool.downgrade if target < 21 else dqtool.upgrade)(fused_path, target, out)
    report = dqtool.lint(out, target=f"onnx-opset-{target}")
    assert [f.code for f in report.findings if f.severity == "error"] == []


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.32"])
def test_onnxruntime_accepts_them(fused_path, target):
    report = dqtool.lint(fused_path, target=target)
    assert [f.code for f in report.findings if f.code == "DQ109"] == []


def test_onnxruntime_flags_what_its_cpu_kernel_rejects(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 8, 32, nbits_inputs(rng, 64, 8, 8, 32, zp="float")), path)
    found = [f for f in dqtool.lint(path, target="onnxruntime").findings if f.code == "DQ109"]
    assert len(found) == 1 and "float zero points" in found[0].message


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.31", "onnxruntime-1.32"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_onnxruntime_flags_an_a_type_its_release_has_no_kernel_for(tmp_path, target, dtype):
    """A bfloat16 MatMulNBits passed lint for onnxruntime, which cannot load it (no CPU
    kernel in 1.31 and 1.32, measured: NOT_IMPLEMENTED). The fact is the release's
    profile; ``onnxruntime`` judges by the installed release, probed."""

    from dqtool.runtimes import onnxruntime as ort_profiles

    np_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(2)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32, np_type),
                          dtype=np_type), path)
    found = [f for f in dqtool.lint(path, target=target).findings if f.code == "DQ109"]
    release = target.removeprefix("onnxruntime").removeprefix("-") or None
    runs = dtype in ort_profiles.profile_for(release).matmulnbits_a_types
    if release is not None:  # the fixed profiles, as measured
        assert runs == (dtype == "float16")
    assert [f.node for f in found] == ([] if runs else ["mm"])
    assert all(f"no MatMulNBits kernel for {dtype} A" in f.message for f in found)


def test_after_upgrade_the_fused_finding_is_gone(fused_path, tmp_path):
    out = tmp_path / "u.onnx"
    dqtool.upgrade(fused_path, 21, out)
    report = dqtool.lint(out, target="onnx-opset-21")
    assert [f.code for f in report.findings if f.code == "DQ109"] == []


def test_gather_block_quantized_is_flagged_too(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(gbq_model(np.zeros((4, 32), np.uint8), np.ones((4, 1), np.float32), None,
                        bits=8), path)
    found = [f for f in dqtool.lint(path, target="directml-fl6.2").findings
             if f.code == "DQ109"]
    assert len(found) == 1 and "GatherBlockQuantized" in found[0].message
    assert "DequantizeLinear + Gather" in found[0].fix


def _broken(tmp_path, how: str):
    rng = np.random.default_rng(2)
    proto = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32))
    node = proto.graph.node[0]
    if how == "bits":
        next(a for a in node.attribute if a.name == "bits").i = 3
    elif how == "scales":  # half the scales
        s = next(t for t in proto.graph.initializer if t.name == "scales")
        s.CopyFrom(onnx.numpy_helper.from_array(np.ones((8, 1), np.float32), "scales"))
    elif how == "missing_k":
        node.attribute.remove(next(a for a in node.attribute if a.name == "K"))
    path = tmp_path / f"{how}.onnx"
    onnx.save(proto, path)
    return path


@pytest.mark.parametrize(("how", "code"), [("bits", "FU002"), ("scales", "FU004"),
                                           ("missing_k", "FU001")])
@pytest.mark.parametrize("target", [None, "onnxruntime"])
def test_an_invalid_fused_node_is_an_error_with_or_without_a_target(tmp_path, how, code,
                                                                    target):
    # onnxruntime refuses these models; lint (and check, below) passed them.
    path = _broken(tmp_path, how)
    report = dqtool.lint(path, target=target)
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1 and found[0].severity == "error" and found[0].node == "mm"
    assert found[0].op == "com.microsoft:MatMulNBits-1"
    assert report.exit_code == 1
    assert code in {p.code for n in dqtool.inspect(path).nodes for p in n.spec.problems}


@pytest.mark.parametrize("target", ["directml-fl6.2", "onnx-opset-21"])
def test_an_invalid_fused_node_gets_no_fix(tmp_path, target):
    """DQ109 offered `dqtool fold` (or a conversion) for a node no conversion or fold takes
    (they keep it, with its problem as the reason): its own FU finding says what is
    wrong."""
    path = _broken(tmp_path, "scales")
    [found] = [f for f in dqtool.lint(path, target=target).findings if f.code == "DQ109"]
    assert found.fix is None
    report = dqtool.fold(path)
    assert report.folded == [] and [n for n, _ in report.prepared_left] == ["mm"]


def test_check_counts_an_invalid_fused_node(tmp_path):
    report = dqtool.check(_broken(tmp_path, "bits"))
    problems = report.structure.problems
    assert [(p["code"], p["severity"], p["node"]) for p in problems] == [("FU002", "error", "mm")]
    assert not report.structure.passed and not report.passed


def test_g_idx_and_accuracy_level_are_reported_below_error(tmp_path):
    rng = np.random.default_rng(3)
    proto = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32), accuracy_level=4)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        (np.arange(64) // 32).astype(np.int32), "g"))
    inputs = proto.graph.node[0].input
    assert len(inputs) == 4  # A, B, scales, zero points: g_idx is the fifth
    inputs.append("g")
    path = tmp_path / "g.onnx"
    onnx.save(proto, path)
    report = dqtool.lint(path)
    assert sorted((f.code, f.severity) for f in report.findings) == [
        ("FU005", "warning"), ("FU006", "info")]
    assert report.exit_code == 0


def test_lint_of_a_model_object_says_it_takes_paths(fused_path):
    # It raised a raw OSError ("File name too long") on the model's repr.
    import onnx_ir as ir

    from dqtool.errors import UsageError

    model = ir.load(fused_path)
    for arg in (model, [model], [fused_path, model]):
        with pytest.raises(UsageError, match="lint takes model paths, got Model"):
            dqtool.lint(arg)
    assert dqtool.lint((fused_path,)).exit_code == 0


def test_lint_takes_any_iterable_of_paths(fused_path):
    # A generator (Path.glob) was refused as if it were a model object.
    folder = fused_path.parent
    report = dqtool.lint(folder.glob("*.onnx"))
    assert report.exit_code == 0 and len(report.inputs) == 1
    assert dqtool.lint({fused_path}).exit_code == 0

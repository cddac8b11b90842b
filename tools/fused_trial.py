"""The judge's trial of the fused family, on models written by onnxruntime's own
``MatMulNBitsQuantizer``: ``python -m tools.fused_trial [--quick] [--keep DIR]``.

For every model it runs what a user (and the issue's judge) runs, in process through the
CLI: ``inspect --json`` counts every fused op; ``upgrade --opset 21`` leaves none, passes
``onnx.checker.check_model(full_check=True)``, onnxruntime runs it and ``check --against``
passes with every weight bit-identical; ``pack`` gives the original ops back (byte-identical
tensors); ``fold`` and ``fold --dtype float16`` leave no quantized weight and onnxruntime
runs them; ``lint --target`` flags the fused ops on every target that is not onnxruntime
and accepts them on onnxruntime's. Prints one line per model and step, and exits 1 if any
step failed. ``tests/test_fused_trial.py`` runs it (a few cases by default, every case with
``DQTOOL_SLOW=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FUSED = ("MatMulNBits", "GatherBlockQuantized")
NON_ORT_TARGETS = ("onnx-opset-13", "onnx-opset-21", "onnx-opset-25", "directml-fl1.0",
                   "directml-fl2.1", "directml-fl3.0", "directml-fl6.0", "directml-fl6.2",
                   "directml-fl6.3", "onednn-graph", "opmx")
ORT_TARGETS = ("onnxruntime", "onnxruntime-1.31", "onnxruntime-1.32")


@dataclass
class Case:
    name: str
    build: Callable[[], onnx.ModelProto]
    shapes: tuple[str, ...] = ()  # check --shape arguments
    repack: bool = True  # pack gives back byte-identical tensors (the quantizer wrote them)
    pack_args: tuple[str, ...] = ()  # what the user tells pack that upgrade cannot keep
    notes: list[str] = field(default_factory=list)


# ---- float models ---------------------------------------------------------------------

def float_lm(*, vocab: int = 96, d: int = 128, h: int = 160, bias: bool = False,
             gather: bool = True) -> onnx.ModelProto:
    """Gather (or a float input) → MatMul (→ Add bias) → Relu → MatMul: a tiny language model
    with a symbolic batch."""
    r = np.random.default_rng(vocab * 1000 + d * 10 + h + bias)
    inits = [numpy_helper.from_array((r.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32),
                                     "up.weight"),
             numpy_helper.from_array((r.standard_normal((h, d)) / np.sqrt(h)).astype(np.float32),
                                     "down.weight")]
    nodes = []
    if gather:
        inits.append(numpy_helper.from_array(r.standard_normal((vocab, d)).astype(np.float32),
                                             "embed.weight"))
        nodes.append(helper.make_node("Gather", ["embed.weight", "ids"], ["x"], "embed/Gather"))
        inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])]
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, d])]
    nodes.append(helper.make_node("MatMul", ["x", "up.weight"], ["u0"], "up/MatMul"))
    if bias:
        inits.append(numpy_helper.from_array(r.standard_normal(h).astype(np.float32), "up.bias"))
        nodes.append(helper.make_node("Add", ["u0", "up.bias"], ["u"], "up/Add"))
    else:
        nodes[-1].output[0] = "u"
    nodes += [helper.make_node("Relu", ["u"], ["a"], "act"),
              helper.make_node("MatMul", ["a", "down.weight"], ["logits"], "down/MatMul")]
    g = helper.make_graph(nodes, "lm", inputs,
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                         ["batch", 4, d])], inits)
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def float_if(d: int = 64, h: int = 96) -> onnx.ModelProto:
    """A MatMul inside each branch of an If (the weights are the branches' initializers)."""
    r = np.random.default_rng(11)

    def branch(name: str, scale: float) -> onnx.GraphProto:
        w = numpy_helper.from_array(
            (r.standard_normal((d, h)) * scale).astype(np.float32), f"{name}.weight")
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", f"{name}.weight"], [f"{name}.y"],
                              f"{name}/MatMul")], name, [],
            [helper.make_tensor_value_info(f"{name}.y", TensorProto.FLOAT, None)], [w])

    nodes = [helper.make_node("If", ["cond"], ["y"], "if", then_branch=branch("then", 0.1),
                              else_branch=branch("else", 0.2))]
    g = helper.make_graph(
        nodes, "ifg", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, h])])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def to_float16(model: onnx.ModelProto, keep_io_types: bool = False) -> onnx.ModelProto:
    """onnxruntime's float16 converter (by default inputs and outputs too: an fp16 model
    end to end; ``keep_io_types``: float32 inputs and outputs, Cast inside)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with _quiet():
        return convert_float_to_float16(model, keep_io_types=keep_io_types,
                                        disable_shape_infer=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import logging

    level = logging.root.level
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)
        logging.root.setLevel(level)


def quantize(model: onnx.ModelProto, *, bits: int = 4, block: int = 32, symmetric: bool = True,
             gather: bool = True, accuracy_level: int | None = None, hqq: bool = False,
             quant_axes: tuple | None = None) -> onnx.ModelProto:
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    ops = ("MatMul", "Gather") if gather else ("MatMul",)
    if hqq:
        cfg = mnq.HQQWeightOnlyQuantConfig(block_size=block, bits=bits, op_types_to_quantize=ops)
    else:
        cfg = mnq.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                               bits=bits, accuracy_level=accuracy_level,
                                               op_types_to_quantize=ops, quant_axes=quant_axes)
    qz = mnq.MatMulNBitsQuantizer(model, algo_config=cfg)
    with _quiet():
        qz.process()
    return qz.model.model


def cases(quick: bool = False) -> list[Case]:
    out: list[Case] = []
    for dtype in ("float32", "float16"):
        for bits in (2, 4, 8):
            for symmetric in (True, False):
                for block in (32, 128):
                    if quick and not (bits == 4 and block == 32 and symmetric != (
                            dtype == "float16")):
                        continue

                    def build(bits=bits, symmetric=symmetric, block=block, dtype=dtype):
                        m = float_lm(gather=bits == 4)
                        if dtype == "float16":
                            m = to_float16(m)
                        return quantize(m, bits=bits, block=block, symmetric=symmetric,
                                        gather=bits == 4)

                    sym = "sym" if symmetric else "asym"
                    out.append(Case(f"{dtype}_{bits}bit_{sym}_b{block}", build, ("batch=3",)))
    if quick:
        return out
    out.append(Case("float32_4bit_bias", lambda: quantize(float_lm(bias=True)), ("batch=2",)))
    out.append(Case("float32_4bit_acc4", lambda: quantize(float_lm(), accuracy_level=4),
                    ("batch=2",), pack_args=("--accuracy-level", "4")))
    out.append(Case("float16_4bit_acc4", lambda: quantize(to_float16(float_lm()),
                                                          accuracy_level=4), ("batch=2",),
                    pack_args=("--accuracy-level", "4")))
    out.append(Case("float16_io_float32_4bit_asym_b128",
                    lambda: quantize(to_float16(float_lm(gather=False), keep_io_types=True),
                                     symmetric=False, block=128, gather=False),
                    ("batch=2",)))
    out.append(Case("float32_4bit_gather_quantize_axis0",
                    lambda: quantize(float_lm(), symmetric=False,
                                     quant_axes=(("Gather", 0),)), ("batch=2",)))
    out.append(Case("float32_4bit_if", lambda: quantize(float_if(), gather=False)))
    out.append(Case("float16_4bit_if", lambda: quantize(to_float16(float_if()),
                                                        gather=False)))
    out.append(Case("float32_matmulnbits_bias_input", _nbits_with_bias, repack=False))
    # K's codes end inside a byte (odd K at 4 bits, K % 4 at 2 bits; the quantizer leaves
    # codes past K there) and a K under one block (upgraded per-axis)
    out.append(Case("float32_4bit_asym_b32_odd_k",
                    lambda: quantize(float_lm(d=64, h=33), symmetric=False), ("batch=2",)))
    out.append(Case("float32_2bit_sym_b32_k34",
                    lambda: quantize(float_lm(d=64, h=34, gather=False), bits=2,
                                     gather=False), ("batch=2",)))
    out.append(Case("float16_4bit_asym_b128_k51",
                    lambda: quantize(to_float16(float_lm(d=64, h=51)), symmetric=False,
                                     block=128), ("batch=2",)))
    for dtype in ("float32", "float16"):
        out.append(Case(f"{dtype}_4bit_float_zero_points", lambda d=dtype: _hqq_like(d),
                        ("batch=2",)))
    # HQQ quantizes MatMul only (its Gather raises NotImplementedError in onnxruntime 1.32)
    out.append(Case("float32_4bit_hqq", lambda: quantize(float_lm(gather=False), hqq=True,
                                                         gather=False), ("batch=2",)))
    out += shipped_cases()
    return out


# Models the quantizer wrote where torch was installed (HQQ needs it), kept in the
# repository so that every run tries them (tests/data/README.md says how they were made).
SHIPPED = Path(__file__).resolve().parents[1] / "tests" / "data"


def shipped_cases() -> list[Case]:
    return [Case(f"shipped_{p.stem}", lambda p=p: onnx.load(str(p)), ("batch=2",))
            for p in sorted(SHIPPED.glob("ort_hqq_*.onnx"))]


def _hqq_like(dtype: str = "float32") -> onnx.ModelProto:
    """What HQQWeightOnlyQuantConfig writes (it needs torch, which may be missing): flat
    scales and fractional float zero points of the scales' type, ``q·s + (-(zp·s))``.
    Made from the default quantizer's asymmetric output by giving each zero point a
    fraction."""
    from dqtool.families.fused import packing

    base = float_lm(gather=False)
    m = quantize(to_float16(base) if dtype == "float16" else base, symmetric=False,
                 gather=False)
    inits = {t.name: t for t in m.graph.initializer}
    rng = np.random.default_rng(17)
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        a = {x.name: x.i for x in n.attribute}
        kb = -(-a["K"] // a["block_size"])
        scales = numpy_helper.to_array(inits[n.input[2]])
        codes = packing.unpack(numpy_helper.to_array(inits[n.input[3]]).reshape(a["N"], -1),
                               a["bits"])[:, :kb]
        zp = (codes + rng.random(codes.shape)).astype(scales.dtype).reshape(-1)
        inits[n.input[2]].CopyFrom(numpy_helper.from_array(scales.reshape(-1), n.input[2]))
        inits[n.input[3]].CopyFrom(numpy_helper.from_array(zp, n.input[3]))
    return m


def _nbits_with_bias() -> onnx.ModelProto:
    """The quantizer never writes MatMulNBits' bias input (the model builder does): take
    its output and move the bias Add into the node."""
    m = quantize(float_lm(bias=True, gather=False))
    g = m.graph
    add = next(n for n in g.node if n.op_type == "Add")
    mm = next(n for n in g.node if n.op_type == "MatMulNBits" and n.output[0] == add.input[0])
    while len(mm.input) < 5:
        mm.input.append("")
    mm.input.append(add.input[1])
    mm.output[0] = add.output[0]
    g.node.remove(add)
    return m


# ---- the steps ----------------------------------------------------------------------------

def _cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from dqtool.cli import cli

    r = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})
    if r.exception and not isinstance(r.exception, SystemExit):
        return 99, f"{r.output}\n{type(r.exception).__name__}: {r.exception}"
    return r.exit_code, r.output


def _graphs(g: onnx.GraphProto):
    """``g`` and every subgraph below it (If/Loop/Scan bodies)."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            for sub in a.graphs:
                yield from _graphs(sub)


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    nodes = [n for g in _graphs(model.graph) for n in g.node]
    for n in [*nodes, *(n for f in model.functions for n in f.node)]:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def _fused_count(model: onnx.ModelProto) -> int:
    return sum(_ops(model).get(op, 0) for op in FUSED)


def _ort_runs(path: Path, shapes: tuple[str, ...]) -> str | None:
    import onnxruntime as ort

    from dqtool.checking import inputs as inputs_mod
    from dqtool.checking.inputs import parse_shapes

    model = onnx.load(str(path))
    feeds, _ = inputs_mod.generate(model, seed=0, shapes=parse_shapes(shapes))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # the point is to report it
        return f"onnxruntime cannot run it: {str(e).splitlines()[0][:200]}"
    return None


def _tensors(model: onnx.ModelProto) -> dict[str, bytes]:
    from onnx import numpy_helper as nh

    return {t.name: nh.to_array(t).tobytes() for g in _graphs(model.graph)
            for t in g.initializer}


def _fused_signature(model: onnx.ModelProto) -> list[tuple]:
    """Each fused node's attributes and the bytes of its weight's constant inputs."""
    tensors = _tensors(model)
    sig = []
    for g in _graphs(model.graph):
        for n in g.node:
            if n.op_type not in FUSED:
                continue
            attrs = sorted((a.name, helper.get_attribute_value(a)) for a in n.attribute)
            # the weight's tensors (pack may also take a bias Add into MatMulNBits)
            picks = (1, 2, 3, 4) if n.op_type == "MatMulNBits" else (0, 2, 3)
            consts = [tensors.get(n.input[i]) for i in picks
                      if i < len(n.input) and n.input[i] in tensors]
            sig.append((n.op_type, tuple(attrs), tuple(consts)))
    return sig


def _quantized_weights(model: onnx.ModelProto) -> list[str]:
    ops = _ops(model)
    return [f"{ops[k]} {k}" for k in (*FUSED, "DequantizeLinear") if ops.get(k)]


def run_case(case: Case, workdir: Path) -> list[tuple[str, str | None]]:
    """(step, None if it passed else why) for each step of the trial."""
    steps: list[tuple[str, str | None]] = []
    d = workdir / case.name
    d.mkdir(parents=True, exist_ok=True)
    src = d / "orig.onnx"
    try:
        model = case.build()
    except Exception as e:
        return [("build", f"cannot build: {type(e).__name__}: {str(e).splitlines()[0][:200]}")]
    onnx.save(model, str(src))
    n_fused = _fused_count(model)
    steps.append(("quantizer wrote fused ops", None if n_fused else "no fused op written"))
    shape_args = [a for s in case.shapes for a in ("--shape", s)]

    rc, out = _cli("inspect", str(src), "--json")
    counted = None
    try:
        summary = json.loads(out)
        counted = sum(json.dumps(summary).count(f'"{op}"') for op in FUSED)
        fused_nodes = _find_key(summary, "fused_nodes")
        counted = fused_nodes if fused_nodes is not None else counted
    except json.JSONDecodeError:
        pass
    steps.append(("inspect --json counts every fused op",
                  None if counted == n_fused else f"counted {counted}, model has {n_fused} "
                  f"(exit {rc})"))

    up = d / "up.onnx"
    rc, out = _cli("upgrade", str(src), "--opset", "21", "-o", str(up))
    if rc != 0 or not up.exists():
        steps.append(("upgrade --opset 21", f"exit {rc}: {out[-400:]}"))
        return steps
    upm = onnx.load(str(up))
    steps.append(("upgrade leaves no fused op",
                  None if _fused_count(upm) == 0 else f"{_fused_count(upm)} left"))
    try:
        onnx.checker.check_model(str(up), full_check=True)
        steps.append(("upgrade passes onnx.checker (full)", None))
    except Exception as e:
        steps.append(("upgrade passes onnx.checker (full)", str(e).splitlines()[0][:200]))
    steps.append(("onnxruntime runs upgrade", _ort_runs(up, case.shapes)))
    rc, out = _cli("check", str(up), "--against", str(src), *shape_args)
    identical = "bit-identical" in out and ": differ" not in out
    steps.append(("check --against passes", None if rc == 0 and identical
                  else f"exit {rc}: {_tail(out)}"))
    rc, out = _cli("check", str(up), "--against", str(src), *shape_args, "--json")
    try:
        doc = json.loads(out)
        ort_cmp = next(c for c in doc["comparisons"] if c["runtime"] == "onnxruntime")
        reported = all(o.get("max_abs") is not None for o in ort_cmp["outputs"])
        steps.append(("check --against reports the onnxruntime difference",
                      None if reported and not ort_cmp["skipped"] else str(ort_cmp)[:300]))
    except (json.JSONDecodeError, StopIteration, KeyError) as e:
        steps.append(("check --against --json", f"{type(e).__name__}: {out[-300:]}"))

    packed = d / "packed.onnx"
    rc, out = _cli("pack", str(up), "-o", str(packed), *case.pack_args)
    if rc != 0 or not packed.exists():
        steps.append(("pack", f"exit {rc}: {_tail(out)}"))
    else:
        pm = onnx.load(str(packed))
        counts = {op: _ops(pm).get(op, 0) for op in FUSED}
        want = {op: _ops(model).get(op, 0) for op in FUSED}
        steps.append(("pack restores the fused ops", None if counts == want
                      else f"{counts} vs the original's {want}"))
        if case.repack:
            same = _fused_signature(pm) == _fused_signature(model)
            steps.append(("pack gives back byte-identical tensors and attributes",
                          None if same else "differ"))
        rc, out = _cli("check", str(packed), "--against", str(src), *shape_args)
        steps.append(("check packed --against passes",
                      None if rc == 0 else f"exit {rc}: {_tail(out)}"))

    for extra in ((), ("--dtype", "float16")):
        folded = d / f"fold{'_'.join(extra)}.onnx"
        rc, out = _cli("fold", str(src), "-o", str(folded), *extra)
        label = "fold" + (" " + " ".join(extra) if extra else "")
        if rc != 0 or not folded.exists():
            steps.append((label, f"exit {rc}: {_tail(out)}"))
            continue
        left = _quantized_weights(onnx.load(str(folded)))
        steps.append((f"{label} leaves no quantized weight", None if not left
                      else ", ".join(left) + " left"))
        steps.append((f"onnxruntime runs {label}", _ort_runs(folded, case.shapes)))
        if not extra:
            rc, out = _cli("check", str(folded), "--against", str(src), *shape_args)
            steps.append(("check fold --against passes",
                          None if rc == 0 else f"exit {rc}: {_tail(out)}"))

    for target in (*NON_ORT_TARGETS, *ORT_TARGETS):
        rc, out = _cli("lint", str(src), "--target", target, "--json")
        try:
            findings = _findings(json.loads(out))
        except json.JSONDecodeError:
            steps.append((f"lint --target {target}", f"exit {rc}: {_tail(out)}"))
            continue
        if target in ORT_TARGETS:
            errors = [f for f in findings if f.get("severity") == "error"]
            steps.append((f"lint --target {target} accepts them",
                          None if rc == 0 and not errors else
                          f"exit {rc}: {[f.get('code') for f in errors]}"))
            continue
        flagged = [f for f in findings if f.get("code") == "DQ109"]
        fix = all("dqtool upgrade" in json.dumps(f) or "dqtool fold" in json.dumps(f)
                  for f in flagged)
        steps.append((f"lint --target {target} flags them",
                      None if len(flagged) == n_fused and fix and rc == 1
                      else f"exit {rc}, {len(flagged)} DQ109 of {n_fused} fused"))
    # check alone: every fused node bit-exact on onnxruntime against the kernel (the
    # model's structure is the quantizer's business: its float16 converter's Casts come
    # after their consumers, which onnx's checker rejects)
    rc, out = _cli("check", str(src), *shape_args, "--json")
    try:
        nodes = [n for n in json.loads(out)["nodes"] if n["op"].startswith("com.microsoft:")]
        exact = [n for n in nodes if n["status"] == "bit-exact"]
        steps.append(("check alone: every fused weight bit-exact on onnxruntime",
                      None if len(exact) == len(nodes) == n_fused else
                      f"{len(exact)} of {n_fused} bit-exact: "
                      f"{[(n['name'], n['status'], n['reason']) for n in nodes][:3]}"))
    except (json.JSONDecodeError, KeyError) as e:
        steps.append(("check alone", f"{type(e).__name__}: {_tail(out)}"))
    return steps


def _tail(out: str, n: int = 600) -> str:
    return " | ".join(line.strip() for line in out.strip().splitlines()[-8:])[-n:]


def _find_key(doc, key: str):
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def _findings(doc) -> list[dict]:
    if isinstance(doc, list):
        return [f for d in doc for f in _findings(d)]
    if isinstance(doc, dict):
        if "findings" in doc:
            return list(doc["findings"])
        for v in doc.values():
            if isinstance(v, (list, dict)):
                got = _findings(v)
                if got:
                    return got
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few cases only")
    p.add_argument("--keep", metavar="DIR", help="write the models here and keep them")
    p.add_argument("--only", metavar="SUBSTRING", help="cases whose name contains this")
    args = p.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="dqtool-trial-") as tmp:
        work = Path(args.keep or tmp)
        for case in cases(args.quick):
            if args.only and args.only not in case.name:
                continue
            for step, why in run_case(case, work):
                failed += why is not None
                print(f"{'ok  ' if why is None else 'FAIL'} {case.name}: {step}"
                      + ("" if why is None else f": {why}"), flush=True)
    print(f"{failed} step(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "200")
    sys.exit(main())

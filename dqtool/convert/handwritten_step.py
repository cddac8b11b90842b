"""``upgrade --handwritten``: after the opset conversion, each dequantization written by
hand (Cast → Sub → Mul, ``dqtool.handwritten``) becomes an ai.onnx DequantizeLinear at the
target opset, exactly, reported with the other nodes; all or nothing, as the conversion."""

from __future__ import annotations

from dqtool import handwritten
from dqtool.convert.report import ConversionRefused, ConvertReport, NodeChange, NodeRefusal


def _op(record: handwritten.Handwritten) -> str:
    return "hand-written " + " → ".join(record.ops)


def apply(report: ConvertReport, opset: int) -> None:
    """Rewrite ``report.model``'s hand-written dequantizations at ``opset`` (the model's
    opset after the conversion); raises ``ConversionRefused`` with the report when one
    has no exact DequantizeLinear form there."""
    assert report.model is not None
    done = handwritten.rewrite(report.model, opset)
    for o in done.changed:
        r = o.record
        report.changes.append(NodeChange(
            r.nodes[-1], r.graph, _op(r), "changed", o.how,
            "exact: bit-identical on onnxruntime and the reference evaluator "
            "(docs/handwritten.md)"))
    for o in done.left:
        r = o.record
        report.changes.append(NodeChange(r.nodes[-1], r.graph, _op(r), "kept",
                                         "left as written", o.how))
    for o in done.refused:
        r = o.record
        report.refusals.append(NodeRefusal(r.nodes[-1], r.graph, _op(r), o.how))
    if report.refusals:
        raise ConversionRefused(report)
    report.model = done.model

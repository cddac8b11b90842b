"""OpenPPL's opmx DequantizeLinear (and the legacy ``pmx`` domain, the same operator).

int8, or int4 packed four per int16 along dimension 0; groups along ``quant_axis``; a float
or integer zero point. The driver turns it into ai.onnx DequantizeLinear where exact
(``convert.py`` here); nothing turns ai.onnx into opmx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dqtool.registry.family import Family

if TYPE_CHECKING:
    from dqtool.convert.registry import Registry

# Each hook imports what it needs when it is called: the registry is read by the codecs and
# the evaluator, below every family, so a family's top level imports none of the engines
# (dqtool/registry/family.py).

DOMAINS = ("opmx", "pmx")


def _codecs() -> list[Any]:
    from dqtool.codecs import opmx

    return opmx.codecs()


def _evaluator_ops() -> list[type[Any]]:
    from dqtool.kernel import evaluator

    return [evaluator.named(evaluator.OpmxDq, "DequantizeLinear", d) for d in DOMAINS]


def _fold() -> Any:
    from dqtool.families.qdq_opmx import fold

    return fold.fold_support()


def _converters(reg: Registry) -> None:
    from dqtool.families.qdq_opmx import convert

    convert.register(reg)


FAMILY = Family(
    name="qdq_opmx",
    keys=tuple((d, "DequantizeLinear", 1) for d in DOMAINS),
    codecs=_codecs,
    evaluator_ops=_evaluator_ops,
    fold=_fold,
    converters=_converters,
    prunable=frozenset(DOMAINS),
    lint_facts={"onnxruntime": "onnxruntime has no {domain} domain",
                "directml": "DirectML has no {domain} operator",
                "opmx": "native"},
    lint_modules=(),
    # What the codec reads (quant_method is OpenPPL's note and never read).
    attribute_types={"DequantizeLinear": {
        "quant_data_type": "STRING", "quant_axis": "INT", "group_size": "INT",
        "has_zeropoint": "INT", "float_zeropoint": "INT"}},
)

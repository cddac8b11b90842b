"""Every command, as the harness runs it on a model at a relative path."""

from __future__ import annotations

OUT = "out/o.onnx"


def for_model(model: str) -> list[list[str]]:
    """One argv per command and mode worth telling apart (reading, writing, in place)."""
    return [
        ["inspect", model],
        ["inspect", "--json", model],
        ["lint", model],
        ["lint", "--target", "onnxruntime", "--format", "json", model],
        ["check", model],
        ["check", model, "--against", model],
        ["fold", model, "-o", OUT],
        ["fold", "--json", "--dtype", "float16", model, "-o", OUT],
        ["fold", model, "--in-place"],
        ["fold", model, "--external-data", "-o", OUT],
        ["upgrade", model, "--opset", "21", "-o", OUT],
        ["downgrade", model, "--opset", "13", "-o", OUT],
    ]


WRITING = [i for i, argv in enumerate(for_model("m.onnx"))
           if argv[0] in ("fold", "upgrade", "downgrade")]


def more(model: str) -> list[list[str]]:
    """Every command and output format the newer families also run: JSON, SARIF and
    GitHub lint output, check's JSON, and the writers that rewrite operators (pack, qdq,
    qoperator), which read fused and integer operators' attributes."""
    return [
        *for_model(model),
        ["lint", "--format", "sarif", model],
        ["lint", "--format", "github", model],
        ["lint", "--json", model],
        ["check", "--json", model],
        ["pack", model, "-o", OUT],
        ["qdq", model, "--keep-unconvertible", "-o", OUT],
        ["qoperator", model, "-o", OUT],
    ]

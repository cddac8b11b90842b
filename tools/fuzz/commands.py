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

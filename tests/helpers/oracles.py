"""The runtimes' own per-node verdicts, to hold lint's deployment targets to.

- QNN HTP (``onnxruntime-qnn``): a session on the HTP backend with CPU fallback disabled;
  onnxruntime's verbose log of the QNN EP's first capability pass lists every node unit it
  validated (``Validation PASSED|FAILED for N nodes in OrtNodeUnit (Conv)``, the nodes, and
  the reason when it failed). A node runs quantized when its unit passed and holds a
  DequantizeLinear (a unit of the node alone is a float operator).
- OpenVINO (``openvino``, CPU plugin): the compiled model's runtime model; a layer runs in
  int8 when its first input arrives as u8/i8 (a weight-compressed float layer has an i8
  weight and a float input). Inference precision is pinned to f32, so the float fallback
  does not turn into bf16 on CPUs that have it: the verdict does not depend on the machine.

Both return {node name: (quantized, why)} for the nodes named; each import is deferred, so
a test module skips cleanly where the package is absent.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

_HEAD = re.compile(r"LogNodeSupport\] Validation (PASSED|FAILED) for \d+ nodes in "
                   r"OrtNodeUnit \((\w+)\)")
_PASS = re.compile(r"GetCapability pass (\d)")
_NODE = re.compile(r"^\tOperator type: (\S+) Node name: (.*) Node index: \d+$")
_QDQ = ("DequantizeLinear", "QuantizeLinear")


def qnn_units(log: str) -> list[tuple[bool, list[tuple[str, str]], str | None]]:
    """The first capability pass's node units: (passed, [(op type, name)], reason)."""
    found: list[tuple[bool, list[tuple[str, str]], str | None]] = []
    current: list | None = None
    step = 0
    for line in log.splitlines():
        m = _PASS.search(line)
        if m:
            step, current = int(m.group(1)), None
            continue
        if step != 1:
            continue
        m = _HEAD.search(line)
        if m:
            current = [m.group(1) == "PASSED", [], None]
            found.append(current)  # type: ignore[arg-type]
        elif current is not None and (m := _NODE.match(line)):
            current[1].append((m.group(1), m.group(2)))
        elif current is not None and line.startswith("\tREASON : "):
            current[2] = line[len("\tREASON : "):].strip()
        elif not line.startswith("\t"):
            current = None
    return [tuple(u) for u in found]  # type: ignore[misc]


class Qnn:
    def __init__(self) -> None:
        import onnxruntime as ort
        import onnxruntime_qnn

        self.ort = ort
        if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
            ort.register_execution_provider_library("QNNExecutionProvider",
                                                    onnxruntime_qnn.get_library_path())
        self.devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]

    def log(self, path: str | Path) -> tuple[bool, str]:
        """Whether a session with CPU fallback disabled was created, and the verbose log
        (onnxruntime writes it to file descriptor 2; it is read back from a file)."""
        so = self.ort.SessionOptions()
        so.add_provider_for_devices(self.devices, {"backend_type": "htp"})
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.log_severity_level = 0
        with tempfile.TemporaryFile() as sink:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
            try:
                self.ort.InferenceSession(str(path), so)
                created = True
            except Exception:  # refused: some node would run on the CPU
                created = False
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            sink.seek(0)
            return created, sink.read().decode(errors="replace")

    def verdicts(self, path: str | Path) -> dict[str, tuple[bool, str | None]]:
        _, log = self.log(path)
        out: dict[str, tuple[bool, str | None]] = {}
        for passed, nodes, reason in qnn_units(log):
            has_dq = any(op == "DequantizeLinear" for op, _ in nodes)
            why = reason if not passed else None if has_dq else "float node unit"
            for op, name in nodes:
                if op not in _QDQ:
                    out[name] = (passed and has_dq, why)
        return out


# Runtime layer types that carry an ONNX compute node, by the ONNX op types they run.
_OV_LAYERS = {"Convolution": ("Conv",), "FullyConnected": ("MatMul", "Gemm"),
              "MatMul": ("MatMul", "Gemm"), "Eltwise": ("Add", "Mul", "Sub"),
              "Deconvolution": ("ConvTranspose",)}


class OpenVino:
    def __init__(self) -> None:
        import openvino

        self.core = openvino.Core()

    def verdicts(self, path: str | Path,
                 nodes: list[tuple[str, str, list[str]]]) -> dict[str, tuple[bool, str | None]]:
        """``nodes``: (name, op type, output names) of the ONNX nodes to judge, in graph
        order. A layer is matched by a name in its ``originalLayersNames``; nodes whose
        names fusion dropped are matched in order among layers of their kind."""
        compiled = self.core.compile_model(str(path), "CPU",
                                           {"INFERENCE_PRECISION_HINT": "f32"})
        layers = []
        for op in compiled.get_runtime_model().get_ordered_ops():
            rt = op.get_rt_info()
            kind = rt["layerType"].astype(str)
            if kind not in _OV_LAYERS:
                continue
            names = {n.split("/")[0] for n in rt["originalLayersNames"].astype(str).split(",")}
            first = str(op.input(0).get_element_type()) if op.get_input_size() else ""
            layers.append((kind, names, "uint8_t" in first or "int8_t" in first, first))
        out: dict[str, tuple[bool, str | None]] = {}
        unmatched = []
        for name, op_type, outputs in nodes:
            hit = [lay for lay in layers if lay[1] & {name, *outputs}
                   and op_type in _OV_LAYERS[lay[0]]]
            if hit:
                layers.remove(hit[0])
                out[name] = (hit[0][2], None if hit[0][2] else f"{hit[0][0]} on {hit[0][3]}")
            else:
                unmatched.append((name, op_type))
        for name, op_type in unmatched:
            hit = [lay for lay in layers if op_type in _OV_LAYERS[lay[0]]]
            if hit:
                layers.remove(hit[0])
                out[name] = (hit[0][2], None if hit[0][2] else f"{hit[0][0]} on {hit[0][3]}")
        return out

"""``check --runtime``: the runtimes quantized models are deployed to, run beside the
reference evaluator, as Polygraphy compares runtimes, for quantized models.

- ``qnn-htp``: Qualcomm's HTP through onnxruntime's QNN execution provider
  (``onnxruntime-qnn``, the extra ``dqtool[qnn]``; on x86 its HTP simulator). What the HTP
  does not take runs on onnxruntime's CPU provider (``lint --target qnn-htp`` says which).
- ``openvino``: OpenVINO's CPU plugin (the extra ``dqtool[openvino]``), its inference
  precision pinned to f32, so that a CPU with bf16 does not run the float parts otherwise:
  the numbers do not depend on the machine's instruction set beyond the plugin's own.

Their arithmetic is faithful, not the specification's (HTP requantizes in fixed point): a
run there is measured in quantization steps and reported, never judged; the reference
evaluator decides the verdict. Each package is imported only when asked for.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dqtool.checking.runners import Runtime, RuntimeFailure
from dqtool.errors import UsageError
from dqtool.messages import one_line

RUNTIMES = ("onnxruntime", "qnn-htp", "openvino")
_EXTRA = {"qnn-htp": ("onnxruntime_qnn", "qnn"), "openvino": ("openvino", "openvino")}


def refuse_unknown(runtime: str) -> None:
    """A one-line error for a runtime ``check`` cannot run, or whose package is absent."""
    if runtime not in RUNTIMES:
        raise UsageError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime in _EXTRA:
        module, extra = _EXTRA[runtime]
        try:
            __import__(module)
        except ImportError as e:
            raise UsageError(f"--runtime {runtime} needs the package {module} "
                             f"(pip install 'dqtool[{extra}]'): {one_line(e, 200)}") from None
    if runtime == "qnn-htp" and not _qnn_devices():
        raise UsageError("--runtime qnn-htp: onnxruntime-qnn offers no QNN device on this "
                         "machine")


def describe(runtime: str) -> Runtime:
    if runtime == "qnn-htp":
        import onnxruntime_qnn

        version = getattr(onnxruntime_qnn, "__version__", "?")
        return Runtime("qnn-htp", f"onnxruntime-qnn {version}, QNN execution provider, HTP "
                       "backend (CPU provider for what it does not take); reported in "
                       "quantization steps, not judged")
    import openvino

    return Runtime("openvino", f"OpenVINO {openvino.__version__}, CPU plugin, inference "
                   "precision f32; reported in quantization steps, not judged")


def run(runtime: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
        external_dir: Path | None) -> dict[str, np.ndarray]:
    """The model's outputs on ``runtime``; ``RuntimeFailure`` (one line) when it cannot
    load or run it."""
    try:
        with tempfile.TemporaryDirectory(prefix="dqtool-runtime-") as folder:
            path = _written(model, external_dir, Path(folder))
            if runtime == "qnn-htp":
                with _stdout_to_stderr():
                    return _run_qnn(path, feeds)
            return _run_openvino(path, feeds)
    except RuntimeFailure:
        raise
    except Exception as e:  # the runtimes raise their own exception types
        raise RuntimeFailure(f"{runtime}: {one_line(e, 300)}", str(e)) from None


def _written(model: onnx.ModelProto, external_dir: Path | None, folder: Path) -> Path:
    """The model as a file both runtimes read: its external tensors inlined (a copy),
    within protobuf's 2 GB."""
    if external_dir is not None:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        onnx.external_data_helper.load_external_data_for_model(model, str(external_dir))
    if model.ByteSize() > (2 << 30) - (64 << 20):
        raise RuntimeFailure("models past protobuf's 2 GB are not run on deployment "
                             "runtimes by check")
    path = folder / "model.onnx"
    onnx.save(model, path)
    return path


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """QNN's libraries print to the process's standard output (a "LIBNATIVE: ..." line
    when a session starts), which would break ``--json``: their writes go to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _qnn_devices() -> list[Any]:
    """The QNN execution provider's devices, its library registered once."""
    import onnxruntime as ort
    import onnxruntime_qnn

    def found() -> list[Any]:
        return [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]

    if not found():
        try:
            ort.register_execution_provider_library("QNNExecutionProvider",
                                                    onnxruntime_qnn.get_library_path())
        except Exception:  # a library this platform cannot load: no device, said above
            return []
    return found()


def _run_qnn(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    devices = _qnn_devices()
    so = ort.SessionOptions()
    so.add_provider_for_devices(devices, {"backend_type": "htp"})
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(path), so)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, (np.asarray(v) for v in sess.run(names, dict(feeds))),
                    strict=True))


def _run_openvino(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import openvino

    compiled = openvino.Core().compile_model(str(path), "CPU",
                                             {"INFERENCE_PRECISION_HINT": "f32"})
    by_name: dict[str, Any] = {}
    for port in compiled.inputs:
        for name in port.get_names():
            if name in feeds:
                by_name[name] = feeds[name]
    result = compiled(by_name)
    out: dict[str, np.ndarray] = {}
    for port in compiled.outputs:
        for name in port.get_names():
            out[name] = np.asarray(result[port])
    return out

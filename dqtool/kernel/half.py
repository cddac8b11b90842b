"""float32 → float16 rounding of dequantized values, through onnxruntime's Cast where it is
proven to give NumPy's bits.

NumPy's float32 → float16 cast is a scalar loop (~2.5 ns per element on the project's
machine, most of a float16 fold's time); onnxruntime's CPU Cast converts a buffer with
vector instructions (~0.08 ns). Both round to nearest even, but "both are IEEE" is not a
proof, so the fast cast is used only on a domain where it has been compared exhaustively:
the float32 products ``float32(d) · float32(s)`` of an integer ``d`` in [-255, 255] (every
``x - zero_point`` of a type of at most 8 bits) and every finite float16 or bfloat16 ``s``
(``tests/test_kernel_half.py`` compares all 2·511·63488 of them). The caller says whether
its values are such products (``covers``); anything else (float32 or non-finite scales,
wider integers, float codes, NaN) goes through NumPy.

What a runtime computes is data keyed by its version: the fast cast is used only on the
releases listed in ``VERIFIED`` (each compared on that release), and only after a probe of
the installed runtime (the products of a dozen ``d`` with every finite float16 scale: ties,
subnormal results, overflow to infinity) gave NumPy's bits. Otherwise, or with
``DQTOOL_ORT_CAST=0``, NumPy converts, and the values are the same.

The other way, float16 → float32 (``widen_into``, for ``checking.half_matmul``), is exact,
so the whole domain is 65536 inputs: the probe compares every one of them, in buffers of
several lengths (SIMD body and scalar tails), before onnxruntime's Cast is used
(measured 2026-11-28: ~0.4 ns an element in chunks of 128 Ki, NumPy's ~1.05 ns;
docs/benchmarks.md, "2026-11-28, evening"). A NaN must stay a NaN: onnxruntime quiets a
signalling one, NumPy keeps its bits, and a float32 multiply quiets it anyway (NaN
payloads carry no meaning for dqtool: ``compare.bit_identical``).
"""

from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np

# Releases on which the exhaustive comparison passed (tests/test_kernel_half.py, run on
# each: 1.31.1 and 1.32.0, CPU, Linux x86_64).
VERIFIED = frozenset({"1.31", "1.32"})
# The differences ``x - zero_point`` the proof covers (types of at most 8 bits).
D_RANGE = 255
_SMALL_INTS = frozenset(np.dtype(t) for t in (
    ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4, ml_dtypes.uint4, np.int8, np.uint8))
_SCALES = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
# Below this many elements NumPy's cast costs less than a call into onnxruntime (~6 us).
MIN_ELEMENTS = 1 << 12
# Setting the fast cast up (importing onnxruntime, a session, the probe) costs what NumPy
# spends on about this many elements: a process starts it only once NumPy has cast them
# (docs/decisions.md, "Sizes the code holds").
WARM_UP_ELEMENTS = 1 << 24

_lock = threading.Lock()
_session: object | None = None
_state: bool | None = None  # None: not decided yet
_numpy_elements = 0  # cast by NumPy before the fast cast was set up
_wide_session: object | None = None
_wide_state: bool | None = None
_numpy_widened = 0  # widened by NumPy before the fast widening was set up


def covers(x_dtype: np.dtype, scale_dtype: np.dtype, s32: np.ndarray) -> bool:
    """Are ``float32(x - zp) · s32`` values inside the proven domain (for these types)?"""
    return (np.dtype(x_dtype) in _SMALL_INTS and np.dtype(scale_dtype) in _SCALES
            and bool(np.isfinite(s32).all()))


def probe_values() -> np.ndarray:
    """The probe's float32 inputs: a dozen differences times every finite float16."""
    s = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    s = s[np.isfinite(s)].astype(np.float32)
    d = np.array([-255, -7, -3, 1, 3, 5, 7, 9, 11, 13, 15, 255], np.float32)
    return (d[:, None] * s[None, :]).reshape(-1)


def _cast_session(to_half: bool) -> object | None:
    """A one-Cast session (float32 → float16, or float16 → float32) on a verified release;
    None where onnxruntime is missing, unlisted or fails."""
    # Imported here: dqtool.runtimes.onnxruntime loads onnx (~0.2 s), which the kernel's
    # other callers (fold) never need.
    from dqtool.runtimes.onnxruntime import installed_version, release_of

    version = installed_version()
    if version is None or release_of(version) not in VERIFIED:
        return None
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        src, dst = TensorProto.FLOAT, TensorProto.FLOAT16
        if not to_half:
            src, dst = dst, src
        graph = helper.make_graph(
            [helper.make_node("Cast", ["x"], ["y"], to=dst)], "cast",
            [helper.make_tensor_value_info("x", src, ["n"])],
            [helper.make_tensor_value_info("y", dst, ["n"])])
        model = helper.make_model(graph, ir_version=10,
                                  opset_imports=[helper.make_opsetid("", 21)])
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # the kernel's own threads call it, one chunk each
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime raises its own types; any failure means NumPy
        return None


def _build() -> object | None:
    session = _cast_session(to_half=True)
    if session is None:
        return None
    try:
        x = probe_values()
        got = session.run(None, {"x": x})[0]  # type: ignore[attr-defined]
    except Exception:  # onnxruntime raises its own types; any failure means NumPy
        return None
    with np.errstate(over="ignore"):  # products past 65504 round to infinity
        want = x.astype(np.float16)
    if got.dtype != want.dtype or not np.array_equal(got.view(np.uint16), want.view(np.uint16)):
        return None
    return session


def available() -> bool:
    """Is the fast cast in use (verified release, probe passed, not turned off)?"""
    global _session, _state
    if os.environ.get("DQTOOL_ORT_CAST", "1") == "0":
        return False
    if _state is None:
        with _lock:
            if _state is None:
                _session = _build()
                _state = _session is not None
    return _state


def cast_into(dst: np.ndarray, src: np.ndarray, covered: bool) -> None:
    """``dst[...] = src`` rounded to float16 (NumPy's bits). ``covered``: src holds products
    of the proven domain (see ``covers``); dst and src contiguous, of the same shape."""
    global _numpy_elements
    if covered and src.size >= MIN_ELEMENTS and src.dtype == np.float32 \
            and dst.dtype == np.float16 and src.flags.c_contiguous and dst.flags.c_contiguous:
        if _state is None and _numpy_elements < WARM_UP_ELEMENTS:
            _numpy_elements += src.size  # not worth setting up yet (a race only miscounts)
        elif available() and _run_into(_session, src.reshape(-1), dst.reshape(-1)):
            return
    np.copyto(dst, src, casting="unsafe")


_bindings = threading.local()  # per thread: (session, its IOBinding)


def _run_into(session: object, src: np.ndarray, dst: np.ndarray) -> bool:
    """Run a one-Cast session on the 1-D contiguous ``src``, its output written to ``dst``;
    False where it failed (the caller converts with NumPy).

    The output is bound to ``dst`` itself (``IOBinding``): ``session.run`` would allocate
    an output (fresh memory) and the result be copied from there, which took more than the
    conversion: 2026-11-28, 25 Mi float32 → float16 in chunks of 256 Ki, 8.9 ms by
    ``run`` and a copy, 5.7 ms bound (docs/benchmarks.md, "2026-11-28, evening").
    A session without ``io_binding`` (a test's stand-in) runs and is copied."""
    try:
        if not hasattr(session, "io_binding"):
            dst[...] = session.run(None, {"x": src})[0]  # type: ignore[attr-defined]
            return True
        held = getattr(_bindings, "held", None)
        if held is None or held[0] is not session:
            held = (session, session.io_binding())  # IOBinding is not shared by threads
            _bindings.held = held
        io = held[1]
        io.bind_cpu_input("x", src)
        io.bind_output("y", "cpu", 0, dst.dtype, [dst.size], dst.ctypes.data)
        session.run_with_iobinding(io)  # type: ignore[attr-defined]
        return True
    except Exception:  # onnxruntime raises its own types; NumPy gives the same bits
        return False


def every_half() -> np.ndarray:
    """All 65536 float16 bit patterns, in order."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def same_widening(got: np.ndarray, x: np.ndarray) -> bool:
    """Is ``got`` NumPy's float32 of float16 ``x``: the same bits, a NaN for a NaN?"""
    want = x.astype(np.float32)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    nan = np.isnan(want)
    return bool(np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
                and np.isnan(got[nan]).all())


def _build_widening() -> object | None:
    session = _cast_session(to_half=False)
    if session is None:
        return None
    x = every_half()
    try:
        # the whole domain, then lengths and starts that leave every kind of tail
        for lo, hi in ((0, x.size), (1, 8), (3, 40), (5, 1029), (31744, 31777)):
            part = np.ascontiguousarray(x[lo:hi])
            if not same_widening(session.run(None, {"x": part})[0], part):  # type: ignore
                return None
    except Exception:  # onnxruntime raises its own types; any failure means NumPy
        return None
    return session


def widening_available() -> bool:
    """Is the fast float16 → float32 conversion in use (verified release, probe passed,
    not turned off by ``DQTOOL_ORT_CAST=0``)?"""
    global _wide_session, _wide_state
    if os.environ.get("DQTOOL_ORT_CAST", "1") == "0":
        return False
    if _wide_state is None:
        with _lock:
            if _wide_state is None:
                _wide_session = _build_widening()
                _wide_state = _wide_session is not None
    return _wide_state


def widen_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, float16 to float32: NumPy's values (a NaN stays a NaN, its payload
    may be quieted; see the module docstring). dst contiguous, of src's shape."""
    global _numpy_widened
    if src.dtype == np.float16 and dst.dtype == np.float32 and dst.flags.c_contiguous \
            and src.size >= MIN_ELEMENTS:
        if _wide_state is None and _numpy_widened < WARM_UP_ELEMENTS:
            _numpy_widened += src.size  # not worth setting up yet (a race only miscounts)
        elif widening_available() and _run_into(
                _wide_session, np.ascontiguousarray(src).reshape(-1), dst.reshape(-1)):
            return
    np.copyto(dst, src, casting="unsafe")

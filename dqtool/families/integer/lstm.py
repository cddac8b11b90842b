"""com.microsoft DynamicQuantizeLSTM as onnxruntime's CPU kernel computes it.

An LSTM whose two matrix products are integer GEMMs on 8-bit weights, with the float
operand quantized at run time (``docs/integer-ops.md``):

- W is ``[directions, input_size, 4*hidden]`` and R ``[directions, hidden, 4*hidden]``
  (already transposed), gates in the order i, o, f, c; the weight zero point is one value
  per direction (onnxruntime reads the first; per-column zero points must all be equal), the
  scale per direction or per column.
- ``X·W``: the whole input block (the first ``max(sequence_lens)`` steps, every batch row;
  for the reverse direction each row's sequence reversed first) is quantized once as
  DynamicQuantizeLinear does (uint8, min/max including 0), multiplied as integers, each
  int32 result times ``float32(a_scale · w_scale)``.
- ``H·R``: at each step the previous hidden state of a group of batch rows is quantized the
  same way and its product, scaled, is added to the step's ``X·W`` row. onnxruntime splits
  the batch into groups when it computes rows in parallel (``row_groups``): more than four
  rows, or two or more with ``hidden <= 256``, in ``ceil(batch / threads)`` rows per group.
- Gates: bias ``Wb + Rb`` added and clipped, peepholes ``C·P`` added first, f/g/h
  activations as onnxruntime computes them (sigmoid and tanh: MLAS's, ``mlas.py``; relu,
  affine, leakyrelu, thresholdedrelu, hardsigmoid, softsign, scaledtanh, elu: its scalar
  formulas with their alpha/beta), ``C = C_prev·f + i·g``, ``H = h(C)·o``.
  A row past its sequence length keeps its state; its Y rows are zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar

import numpy as np

from dqtool.families.integer import kernel, mlas
from dqtool.families.integer.kernel import dynamic_quantize_linear

F32 = np.float32

# onnxruntime's intra-op degree of parallelism for the reference evaluator's
# DynamicQuantizeLSTM (1: the result of a one-thread session). ``check`` sets it to match
# a session that grouped the batch rows by thread.
THREADS: ContextVar[int] = ContextVar("dqtool_lstm_threads", default=1)


def _f(x) -> np.ndarray:
    return np.asarray(x, F32)


# onnxruntime's LSTM activations, by lower-cased name: sigmoid and tanh are MLAS's; the
# others are plain float32 expressions in the order onnxruntime writes them, those with
# exp/log evaluated in double (libm's double functions) and rounded to float32 once.
_PLAIN = {
    "sigmoid": lambda x, a, b: mlas.logistic(x),
    "tanh": lambda x, a, b: mlas.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, F32(0)).astype(F32),
    "affine": lambda x, a, b: ((a * x).astype(F32) + b).astype(F32),
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, (a * x).astype(F32)).astype(F32),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, F32(0)).astype(F32),
    "hardsigmoid": lambda x, a, b: np.minimum(F32(1), np.maximum(
        F32(0), ((a * x).astype(F32) + b).astype(F32))).astype(F32),
    "softsign": lambda x, a, b: (x / (F32(1) + np.abs(x)).astype(F32)).astype(F32),
}


def _expf(x: np.ndarray) -> np.ndarray:
    """libm's float exp: correctly rounded but for rare ties (its error is under 0.502
    ulp), emulated by the double exp rounded to float32."""
    with np.errstate(over="ignore"):
        return np.exp(np.asarray(x, np.float64)).astype(F32)


def _scalar_sigmoid(x: np.ndarray) -> np.ndarray:
    """onnxruntime's scalar Sigmoid (the one ScaledTanh uses, not MLAS's), in float32."""
    d = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        e = _expf(np.where(d >= 0, -d, d))
        return np.where(d >= 0, F32(1) / (F32(1) + e), e / (F32(1) + e)).astype(F32)


def _scaled_tanh(x, a, b):
    t = ((F32(2) * _scalar_sigmoid((F32(2) * (b * x).astype(F32)).astype(F32))).astype(F32)
         - F32(1)).astype(F32)
    return (a * t).astype(F32)


def _elu(x, a, b):
    with np.errstate(over="ignore"):
        neg = (a * (_expf(x) - F32(1)).astype(F32)).astype(F32)
    return np.where(x >= 0, x, neg).astype(F32)


# Softplus (libm's log of 1 + exp) differs from onnxruntime's in the last bits on some
# inputs (measured): it is refused rather than approximated.
_PLAIN.update(scaledtanh=_scaled_tanh, elu=_elu)
# (needs alpha, needs beta, default alpha, default beta), as onnxruntime reads the lists
_ARGS = {"affine": (True, True, 0.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
         "thresholdedrelu": (True, False, 0.0, 0.0), "hardsigmoid": (True, True, 0.2, 0.5),
         "scaledtanh": (True, True, 0.0, 0.0), "elu": (True, False, 1.0, 0.0)}
ACTIVATIONS = frozenset(_PLAIN)


def _activations(names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]):
    """Each activation with its alpha and beta, taken from the lists in order by the
    activations that need them (defaults where a list runs out), as onnxruntime does."""
    ia, ib = iter(alphas), iter(betas)
    out = []
    for name in names:
        key = name.lower()
        if key not in _PLAIN:
            raise NotImplementedError(f"DynamicQuantizeLSTM activation {name!r}: dqtool's "
                                      f"kernel runs {', '.join(sorted(_PLAIN))} (exactly "
                                      "as onnxruntime does)")
        need_a, need_b, da, db = _ARGS.get(key, (False, False, 0.0, 0.0))
        a = F32(next(ia, da)) if need_a else F32(0)
        b = F32(next(ib, db)) if need_b else F32(0)
        fn = _PLAIN[key]
        out.append(lambda x, fn=fn, a=a, b=b: fn(_f(x), a, b))
    return out


def _qgemm(a: np.ndarray, w: np.ndarray, w_zp: int, w_scale: np.ndarray) -> np.ndarray:
    """``a`` (float32 rows) quantized dynamically, times the 8-bit ``w`` as integers, each
    int32 result times ``float32(a_scale · w_scale)`` (per tensor or per column)."""
    qa, sa, za = dynamic_quantize_linear(a)
    acc32 = kernel.integer_matmul(qa, za, w, np.asarray(w_zp)).astype(np.int32)
    mult = (F32(sa) * np.asarray(w_scale, F32)).astype(F32)
    return (acc32.astype(F32) * mult).astype(F32)


def _reverse(x: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Each batch row's first ``lens[b]`` steps reversed; the steps after stay in place."""
    out = x.copy()
    for b, n in enumerate(lens):
        out[:n, b] = x[:n, b][::-1]
    return out


def _groups(batch: int, hidden: int, threads: int) -> list[tuple[int, int]]:
    rows = batch
    if threads > 1 and (batch > 4 or (batch >= 2 and hidden <= 256)):
        rows = -(-batch // threads)
    return [(s, min(s + rows, batch)) for s in range(0, batch, rows)]


def _direction(x: np.ndarray, w: np.ndarray, r: np.ndarray, w_zp: int, r_zp: int,
               w_scale: np.ndarray, r_scale: np.ndarray, bias: np.ndarray | None,
               peep: np.ndarray | None, h0: np.ndarray, c0: np.ndarray, lens: np.ndarray,
               reverse: bool, acts: Sequence, clip: float, input_forget: bool,
               want_y: bool, threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    seq, batch, _ = x.shape
    hidden = r.shape[0]
    f_act, g_act, h_act = acts
    if reverse:
        x = _reverse(x, lens)
    steps = int(lens.max()) if lens.size else 0
    y = np.zeros((seq, batch, hidden), F32)
    iofc = _qgemm(x[:steps].reshape(steps * batch, -1), w, w_zp, w_scale).reshape(
        steps, batch, 4 * hidden) if steps else np.zeros((0, batch, 4 * hidden), F32)
    fused_b = None
    if bias is not None:
        fused_b = (bias[:4 * hidden] + bias[4 * hidden:]).astype(F32).reshape(4, hidden)
    c = c0.astype(F32).copy()
    # Without Y, onnxruntime writes each step's H into Y_h (zeros before a row's first
    # step) and reads the next step's H·R operand from there.
    h_final = np.zeros_like(h0, F32)
    c_final = np.zeros_like(c)
    lim = F32(clip)

    def gate(v: np.ndarray, k: int, peep_c: np.ndarray | None, pk: int, act) -> np.ndarray:
        if peep_c is not None:
            v = (v + (peep_c * peep[pk]).astype(F32)).astype(F32)
        if fused_b is not None:
            v = (v + fused_b[k]).astype(F32)
        v = np.minimum(np.maximum(v, -lim), lim).astype(F32)
        return act(v)

    for lo, hi in _groups(batch, hidden, threads):
        prev = h0[lo:hi].astype(F32)
        for t in range(steps):
            pre = (iofc[t, lo:hi] + _qgemm(prev, r, r_zp, r_scale)).astype(F32)
            live = t < lens[lo:hi]
            i_pre, o_pre, f_pre, c_pre = (pre[:, k * hidden:(k + 1) * hidden] for k in range(4))
            cp = c[lo:hi]
            pc = cp if peep is not None else None
            i = gate(i_pre, 0, pc, 0, f_act)
            f = (F32(1) - i).astype(F32) if input_forget else gate(f_pre, 2, pc, 2, f_act)
            g = gate(c_pre, 3, None, 0, g_act)
            c_new = ((cp * f).astype(F32) + (i * g).astype(F32)).astype(F32)
            o = gate(o_pre, 1, c_new if peep is not None else None, 1, f_act)
            h = (h_act(c_new) * o).astype(F32)
            c[lo:hi] = np.where(live[:, None], c_new, cp)
            for b in np.nonzero(live & (lens[lo:hi] == t + 1))[0]:
                c_final[lo + b] = c_new[b]
            if want_y:
                h_out = np.where(live[:, None], h, F32(0)).astype(F32)
                y[t, lo:hi] = h_out
            else:
                h_out = np.where(live[:, None], h, h_final[lo:hi]).astype(F32)
            h_final[lo:hi] = np.where(live[:, None], h, h_final[lo:hi])
            prev = h_out
    h_final[lens == 0] = 0
    c_final[lens == 0] = 0
    if reverse:
        y = _reverse(y, lens)
    return y, h_final, c_final


def dynamic_quantize_lstm(x, w, r, b=None, sequence_lens=None, initial_h=None,
                          initial_c=None, p=None, w_scale=None, w_zero_point=None,
                          r_scale=None, r_zero_point=None, *, hidden_size: int,
                          direction: str = "forward", activations: Sequence[str] | None = None,
                          activation_alpha: Sequence[float] | None = None,
                          activation_beta: Sequence[float] | None = None,
                          clip: float | None = None, input_forget: int = 0,
                          want_y: bool = True, threads: int = 1
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, Y_h, Y_c). ``threads``: onnxruntime's intra-op degree of parallelism, which
    decides how the batch is grouped for the recurrent quantization (1: one group)."""
    x = np.asarray(x, F32)
    seq, batch, _ = x.shape
    dirs = 2 if direction == "bidirectional" else 1
    acts_all = _activations(activations or ["sigmoid", "tanh", "tanh"] * dirs,
                            activation_alpha or (), activation_beta or ())
    lens = (np.full(batch, seq, np.int64) if sequence_lens is None
            else np.asarray(sequence_lens).astype(np.int64))
    h0 = np.zeros((dirs, batch, hidden_size), F32) if initial_h is None else np.asarray(
        initial_h, F32)
    c0 = np.zeros((dirs, batch, hidden_size), F32) if initial_c is None else np.asarray(
        initial_c, F32)
    wz = np.asarray(w_zero_point).reshape(dirs, -1)
    rz = np.asarray(r_zero_point).reshape(dirs, -1)
    for name, zp in (("W", wz), ("R", rz)):
        # onnxruntime's integer GEMM takes one zero point per matrix: it refuses others.
        if zp.shape[1] > 1 and np.any(zp != zp.flat[0]):
            raise ValueError(f"DynamicQuantizeLSTM: {name}_zero_point must be one value "
                             "(onnxruntime refuses per-column zero points that differ)")
    ws = np.asarray(w_scale, F32).reshape(dirs, -1)
    rs = np.asarray(r_scale, F32).reshape(dirs, -1)
    limit = float(np.finfo(F32).max) if clip is None else clip
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        acts = acts_all[3 * d:3 * d + 3]
        y, h, c = _direction(
            x, np.asarray(w[d]), np.asarray(r[d]), int(wz[d, 0]), int(rz[d, 0]),
            ws[d] if ws.shape[1] > 1 else ws[d, 0], rs[d] if rs.shape[1] > 1 else rs[d, 0],
            None if b is None else np.asarray(b[d], F32),
            None if p is None else np.asarray(p[d], F32).reshape(3, hidden_size),
            h0[d], c0[d], lens, reverse, acts, limit, bool(input_forget), want_y, threads)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return np.stack(ys, axis=1), np.stack(hs), np.stack(cs)

"""Bit packing of MatMulNBits / GatherBlockQuantized codes, and the one-pass repacks to and
from ai.onnx's packed layout.

onnxruntime packs ``8 / bits`` codes per uint8 byte, lowest bits first, along K (MatMulNBits:
B is ``(N, k_blocks, blob)``) or along the last axis (GatherBlockQuantized uint8 data).
ai.onnx packs a uint2/uint4 tensor over its flattened row-major elements, lowest bits first.
So MatMulNBits' ``(N, K)`` codes become ai.onnx's ``(K, N)`` by unpack → transpose → pack,
done here in row bands so that a weight is read and written once, never held unpacked whole.
"""

from __future__ import annotations

import numpy as np

# Bytes of unpacked codes one band may hold (bands keep temporaries in cache-sized pieces).
BAND_BYTES = 1 << 22


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes, the last axis ``8 / bits`` times longer (lowest bits first)."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed
    per, mask = 8 // bits, (1 << bits) - 1
    out = np.empty((*packed.shape, per), np.uint8)
    for j in range(per):
        np.bitwise_and(packed >> (bits * j), mask, out=out[..., j])
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def pack(codes: np.ndarray, bits: int, fill: int = 0) -> np.ndarray:
    """uint8 bytes of ``8 / bits`` codes each along the last axis (padded with ``fill``)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if bits == 8:
        return codes
    per = 8 // bits
    n = codes.shape[-1]
    if n % per:
        pad = np.full((*codes.shape[:-1], per - n % per), fill, np.uint8)
        codes = np.concatenate([codes, pad], axis=-1)
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    out = grouped[..., 0].copy()
    for j in range(1, per):
        out |= grouped[..., j] << (bits * j)
    return out


def _rows_per_band(cols: int) -> int:
    return max(1, BAND_BYTES // max(cols, 1))


def transpose_nibbles(p: np.ndarray, rows: int, cols: int, out: np.ndarray | None = None
                      ) -> np.ndarray:
    """The 4-bit matrix ``(rows, cols)`` packed in ``p`` (``rows`` rows of at least
    ``cols / 2`` bytes), transposed and packed: ``(cols, rows / 2)`` bytes. ``rows`` and
    ``cols`` even.

    Works on bytes, never on single codes: each 2×2 block of codes is two bytes in and two
    bytes out — ``lo(a) | lo(b) << 4`` and ``hi(a) | hi(b) << 4`` of a byte ``a`` of an
    even row and the byte ``b`` below it. Those pairs, interleaved, form a ``(rows / 2,
    cols)`` byte matrix whose plain transpose is the result (``transpose_bytes``).
    """
    half = cols // 2
    pairs = np.empty((rows // 2, half, 2), np.uint8)
    band = max(2, (BAND_BYTES // max(half, 1)) // 2 * 2)
    for r0 in range(0, rows, band):
        r1 = min(rows, r0 + band)
        even = p[r0:r1:2, :half]
        odd = p[r0 + 1:r1:2, :half]
        # contiguous temporaries, then one interleaving copy each (measured quicker than
        # operating on the interleaved views, or than a 64 K-entry table gather)
        pairs[r0 // 2: r1 // 2, :, 0] = (even & 0x0F) | (odd << 4)  # even columns
        pairs[r0 // 2: r1 // 2, :, 1] = (even >> 4) | (odd & 0xF0)  # odd columns
    t = transpose_bytes(pairs.reshape(rows // 2, cols))
    if out is None:
        return t
    out[...] = t
    return out


# Below this many bytes NumPy's transpose is quick enough (and onnxruntime is not imported).
RUNTIME_TRANSPOSE_BYTES = 1 << 20
_SESSION: list = []


def transpose_bytes(m: np.ndarray) -> np.ndarray:
    """``m.T`` of a 2-D uint8 matrix, contiguous. NumPy moves single bytes with a strided
    loop (~0.1 GB/s); onnxruntime's Transpose kernel moves them in SIMD tiles (~0.5 GB/s a
    core), so large weights go through a one-node session when onnxruntime is installed.
    A transpose moves bytes and computes nothing: the result is the same either way."""
    if m.nbytes >= RUNTIME_TRANSPOSE_BYTES:
        session = _transpose_session()
        if session is not None:
            return session.run(None, {"X": np.ascontiguousarray(m)})[0]
    return np.ascontiguousarray(m.T)


def _transpose_session():
    if not _SESSION:
        try:
            import onnxruntime as ort
            from onnx import TensorProto, helper

            graph = helper.make_graph(
                [helper.make_node("Transpose", ["X"], ["Y"], perm=[1, 0])], "t",
                [helper.make_tensor_value_info("X", TensorProto.UINT8, ["r", "c"])],
                [helper.make_tensor_value_info("Y", TensorProto.UINT8, ["c", "r"])])
            model = helper.make_model(graph, ir_version=8,
                                      opset_imports=[helper.make_opsetid("", 13)])
            options = ort.SessionOptions()
            options.log_severity_level = 3
            _SESSION.append(ort.InferenceSession(model.SerializeToString(), options,
                                                 providers=["CPUExecutionProvider"]))
        except Exception:  # no onnxruntime (or it fails to start): NumPy does it
            _SESSION.append(None)
    return _SESSION[0]


def nbits_to_onnx(b: np.ndarray, k: int, n: int, bits: int) -> np.ndarray:
    """MatMulNBits B ``(N, k_blocks, blob)`` → the packed bytes of ai.onnx codes ``(K, N)``
    (uint2 / uint4: flattened row-major, lowest bits first; uint8: the codes)."""
    b = np.asarray(b, dtype=np.uint8).reshape(n, -1)
    if bits == 4 and k % 2 == 0 and n % 2 == 0:
        return transpose_nibbles(b, n, k).reshape(-1)
    if bits == 8:
        return transpose_bytes(b[:, :k]).reshape(-1)
    per = 8 // bits
    out = np.empty(-(-k * n // per), np.uint8)
    # Bands of K rows, a multiple of ``per`` long, so that every band starts on a byte.
    step = max(per, _rows_per_band(n) // per * per)
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        # Whole stored bytes covering K rows k0..k1 (k0 is byte-aligned in B's rows too).
        lo, hi = k0 // per, -(-k1 // per)
        codes = unpack(b[:, lo:hi], bits)[:, : k1 - k0]  # (N, rows)
        band = np.ascontiguousarray(codes.T).reshape(-1)  # (rows, N) flattened
        packed = pack(band, bits)
        out[k0 * n // per: k0 * n // per + packed.size] = packed
    return out


def onnx_to_nbits(codes_kn: np.ndarray, k: int, n: int, bits: int, block: int,
                  pad_codes: np.ndarray | None = None) -> np.ndarray:
    """ai.onnx codes ``(K, N)`` (uint8 values) → MatMulNBits B ``(N, k_blocks, blob)``.

    A ragged last block is padded with ``pad_codes`` (one code per column N; default 0).
    """
    kb = -(-k // block)
    blob = block * bits // 8
    if bits == 4 and k % 2 == 0 and n % 2 == 0 and pad_codes is None:
        # codes_kn may be the packed bytes already (1-D, k·n/2 of them)
        packed = np.ascontiguousarray(codes_kn, dtype=np.uint8) if codes_kn.ndim == 1 \
            else pack(codes_kn, 4)
        out = np.zeros((n, kb * blob), np.uint8)
        transpose_nibbles(packed.reshape(k, n // 2), k, n, out[:, : k // 2])
        return out.reshape(n, kb, blob)
    if bits == 8 and pad_codes is None:
        out = np.zeros((n, kb * blob), np.uint8)
        out[:, :k] = transpose_bytes(np.asarray(codes_kn, np.uint8).reshape(k, n))
        return out.reshape(n, kb, blob)
    out = np.empty((n, kb * blob), np.uint8)
    cols_per_band = max(1, _rows_per_band(k))
    for n0 in range(0, n, cols_per_band):
        n1 = min(n, n0 + cols_per_band)
        band = np.empty((n1 - n0, kb * block), np.uint8)
        band[:, :k] = codes_kn[:, n0:n1].T
        if kb * block > k:
            fill = 0 if pad_codes is None else pad_codes[n0:n1, None]
            band[:, k:] = fill
        out[n0:n1] = pack(band, bits)
    return out.reshape(n, kb, blob)


def onnx_packed_codes(packed: np.ndarray, shape: tuple[int, ...], bits: int) -> np.ndarray:
    """uint8 codes of shape ``shape`` from an ai.onnx packed uint2/uint4 buffer."""
    count = int(np.prod(shape, dtype=np.int64))
    flat = unpack(np.asarray(packed, np.uint8).reshape(-1), bits)[:count]
    return flat.reshape(shape)

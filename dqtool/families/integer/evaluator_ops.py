"""The integer operators as onnx ReferenceEvaluator ops, on this family's exact kernels.

onnx's evaluator has its own QLinearConv/QLinearMatMul/MatMulInteger/ConvInteger/
DynamicQuantizeLinear (float simulations for some) and nothing for the com.microsoft ones;
these classes replace the first and add the second, so the reference evaluator gives what
onnxruntime's CPU kernels give.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.reference.op_run import OpRun

from dqtool.families.integer import attention, embed, lstm, pool
from dqtool.families.integer import kernel as k
from dqtool.kernel.quantize import quantize


class _Op(OpRun):
    op_schema = None  # only the node's own attributes reach _run

    def _attrs(self) -> dict[str, Any]:
        out = {}
        for a in self.onnx_node.attribute:
            from onnx import helper

            out[a.name] = helper.get_attribute_value(a)
        return out


class _QLinearConv(_Op):
    def _run(self, x, xs, xz, w, ws, wz, ys, yz, b=None, **_):
        attrs = self._attrs()
        if attrs.pop("channels_last", 0):
            x = np.moveaxis(x, -1, 1)
            y = k.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, b, **attrs)
            return (np.ascontiguousarray(np.moveaxis(y, 1, -1)),)
        return (k.qlinear_conv(x, xs, xz, w, ws, wz, ys, yz, b, **attrs),)


class _QLinearMatMul(_Op):
    def _run(self, a, a_s, az, b, bs, bz, ys, yz, **_):
        return (k.qlinear_matmul(a, a_s, az, b, bs, bz, ys, yz),)


class _MatMulInteger(_Op):
    def _run(self, a, b, az=None, bz=None, **_):
        return (k.matmul_integer(a, b, az, bz),)


class _ConvInteger(_Op):
    def _run(self, x, w, xz=None, wz=None, **_):
        return (k.conv_integer(x, w, xz, wz, **self._attrs()),)


class _DynamicQuantizeLinear(_Op):
    def _run(self, x, **_):
        return k.dynamic_quantize_linear(x)


class _MatMulIntegerToFloat(_Op):
    def _run(self, a, b, a_s, bs, az=None, bz=None, bias=None, **_):
        return (k.matmul_integer_to_float(a, b, a_s, bs, az, bz, bias),)


class _DynamicQuantizeMatMul(_Op):
    def _run(self, a, b, bs, bz=None, bias=None, **_):
        return (k.dynamic_quantize_matmul(a, b, bs, bz, bias),)


class _QGemm(_Op):
    def _run(self, a, a_s, az, b, bs, bz, c=None, ys=None, yz=None, **_):
        at = self._attrs()
        return (k.qgemm(a, a_s, az, b, bs, bz, c, ys, yz, alpha=at.get("alpha", 1.0),
                        transA=at.get("transA", 0), transB=at.get("transB", 0)),)


class _MulInteger(_Op):
    def _run(self, a, az=None, b=None, bz=None, **_):
        return (k.mul_integer(a, az, b, bz),)


class _QEmbedLayerNormalization(_Op):
    def _run(self, *args, **_):
        full = list(args) + [None] * (18 - len(args))
        eps = self._attrs().get("epsilon", 1e-12)
        return embed.qembed_layer_norm(*full, epsilon=float(eps))


class _QAttention(_Op):
    def _run(self, x, w, bias, xs, ws, mask=None, xz=None, wz=None, past=None, **_):
        at = self._attrs()
        for unsupported in ("do_rotary", "past_present_share_buffer"):
            if at.get(unsupported):
                raise NotImplementedError(f"QAttention {unsupported}=1: dqtool's kernel "
                                          "does not implement it")
        return attention.qattention(
            x, w, bias, xs, ws, mask, xz, wz, past, num_heads=int(at["num_heads"]),
            unidirectional=int(at.get("unidirectional", 0)),
            mask_filter_value=float(at.get("mask_filter_value", -10000.0)),
            scale=float(at.get("scale", 0.0)))


class _DynamicQuantizeLSTM(_Op):
    def _run(self, x, w, r, b=None, seq=None, h0=None, c0=None, p=None, ws=None, wz=None,
             rs=None, rz=None, **_):
        at = self._attrs()
        acts = [a.decode() if isinstance(a, bytes) else a for a in at.get("activations", [])]
        direction = at.get("direction", b"forward")
        y, yh, yc = lstm.dynamic_quantize_lstm(
            x, w, r, b, seq, h0, c0, p, ws, wz, rs, rz, hidden_size=int(at["hidden_size"]),
            direction=direction.decode() if isinstance(direction, bytes) else direction,
            activations=acts or None, activation_alpha=at.get("activation_alpha"),
            activation_beta=at.get("activation_beta"), clip=at.get("clip"),
            input_forget=int(at.get("input_forget", 0)),
            want_y=bool(self.onnx_node.output and self.onnx_node.output[0]),
            threads=lstm.THREADS.get())
        return (y, yh, yc)


def _binary(op: str) -> type[OpRun]:
    class _B(_Op):
        def _run(self, a, a_s, az, b, bs, bz, cs, cz=None, **_):
            return (k.qlinear_binary(op, a, a_s, az, b, bs, bz, cs, cz),)

    return _B


def _lookup(op: str) -> type[OpRun]:
    class _L(_Op):
        def _run(self, x, xs, xz=None, ys=None, yz=None, **_):
            return (k.qlinear_lookup(op, x, xs, xz, ys, yz, self._attrs()),)

    return _L


def _via_float(op: str, drop: tuple[str, ...] = ()) -> type[OpRun]:
    class _F(_Op):
        def _run(self, x, xs, xz=None, ys=None, yz=None, **_):
            attrs = {a: v for a, v in self._attrs().items() if a not in drop}
            last = attrs.pop("channels_last", 0)
            if last:
                x = np.moveaxis(x, -1, 1)
            y = k.qlinear_via_float(op, [(x, xs, xz)], ys, yz, attrs)
            return (np.ascontiguousarray(np.moveaxis(y, 1, -1)) if last else y,)

    return _F


def _pool(global_: bool) -> type[OpRun]:
    """QLinearAveragePool / QLinearGlobalAveragePool, as onnxruntime computes them
    (``pool.py``), in either layout."""
    class _P(_Op):
        def _run(self, x, xs, xz=None, ys=None, yz=None, **_):
            attrs = self._attrs()
            last = attrs.get("channels_last", 0)
            if last:
                x = np.moveaxis(x, -1, 1)
            y = pool.global_average_pool(x, xs, xz, ys, yz) if global_ else \
                pool.average_pool(x, xs, xz, ys, yz, attrs)
            return (np.ascontiguousarray(np.moveaxis(y, 1, -1)) if last else y,)

    return _P


class _QLinearConcat(_Op):
    def _run(self, ys, yz, *rest, **_):
        triples = [tuple(rest[i:i + 3]) for i in range(0, len(rest), 3)]
        return (k.qlinear_via_float("Concat", triples, ys, yz, {"axis": self._attrs()["axis"]}),)


class _QLinearWhere(_Op):
    def _run(self, cond, x, xs, xz, y, ys, yz, zs, zz, **_):
        fx, fy = k._dq(x, xs, xz), k._dq(y, ys, yz)

        return (quantize(np.where(cond, fx, fy).astype(np.float32), zs, zz),)


def _named(base: type[OpRun], name: str, domain: str) -> type[OpRun]:
    return type(name, (base,), {"op_domain": domain})


MS = "com.microsoft"
EVALUATOR_OPS: list[type[OpRun]] = [
    _named(_QLinearConv, "QLinearConv", ""),
    _named(_QLinearConv, "QLinearConv", MS),
    _named(_QLinearMatMul, "QLinearMatMul", ""),
    _named(_MatMulInteger, "MatMulInteger", ""),
    _named(_ConvInteger, "ConvInteger", ""),
    _named(_DynamicQuantizeLinear, "DynamicQuantizeLinear", ""),
    _named(_MatMulIntegerToFloat, "MatMulIntegerToFloat", MS),
    _named(_DynamicQuantizeMatMul, "DynamicQuantizeMatMul", MS),
    _named(_QGemm, "QGemm", MS),
    _named(_DynamicQuantizeLSTM, "DynamicQuantizeLSTM", MS),
    _named(_MulInteger, "MulInteger", MS),
    _named(_QAttention, "QAttention", MS),
    _named(_QEmbedLayerNormalization, "QEmbedLayerNormalization", MS),
    _named(_binary("Add"), "QLinearAdd", MS),
    _named(_binary("Mul"), "QLinearMul", MS),
    _named(_lookup("Sigmoid"), "QLinearSigmoid", MS),
    _named(_lookup("LeakyRelu"), "QLinearLeakyRelu", MS),
    _named(_pool(False), "QLinearAveragePool", MS),
    _named(_pool(True), "QLinearGlobalAveragePool", MS),
    _named(_via_float("Softmax", drop=("opset",)), "QLinearSoftmax", MS),
    _named(_via_float("ReduceMean"), "QLinearReduceMean", MS),
    _named(_QLinearConcat, "QLinearConcat", MS),
    _named(_QLinearWhere, "QLinearWhere", MS),
]

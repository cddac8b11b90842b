"""CPU code paths: the probe's naming, the u8s8 pair-saturation emulation against hand-computed
values and the measured pairings, and the installed onnxruntime against the entry for the
path this test runs on (the spec where none applies)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import paths
from helpers.integer import one_node, run_ort
from onnx import TensorProto as TP

from dqtool.families.integer import kernel as K
from dqtool.runtimes import code_paths, cpu_path

AVX512 = {"AVX2": True, "AVX512F": True}
AVX2 = {"AVX2": True}


@pytest.mark.parametrize(("machine", "features", "saturates", "name"), [
    ("x86_64", AVX512, False, "x86-64-avx512-vnni"),
    ("x86_64", AVX512, True, "x86-64-avx512"),
    ("x86_64", AVX2, True, "x86-64-avx2"),
    ("x86_64", AVX2, False, "x86-64-avx2-vnni"),
    ("x86_64", {}, None, "x86-64-sse"),
    ("aarch64", {"ASIMD": True, "ASIMDDP": True}, False, "arm64-dotprod"),
    ("aarch64", {"ASIMD": True}, False, "arm64-neon"),
    ("aarch64", {"ASIMD": True, "ASIMDDP": True, "I8MM": True}, False, "arm64-i8mm"),
    ("aarch64", {"ASIMDDP": True, "I8MM": True, "SVE": True}, False, "arm64-sve"),
    ("riscv64", {}, None, "riscv64"),
])
def test_path_names(machine, features, saturates, name):
    assert cpu_path.name_for(machine, features, saturates) == name


def _auxv(hwcap: int, hwcap2: int) -> bytes:
    import struct

    return struct.pack("<8Q", 6, 4096, 16, hwcap, 26, hwcap2, 0, 0)


@pytest.mark.parametrize(("hwcap", "hwcap2", "want"), [
    # as qemu-aarch64 7.2 reports them (2026-11-28): -cpu cortex-a72, neoverse-n1, max
    (0x8fb, 0x0, {"ASIMDDP": False, "SVE": False, "I8MM": False}),
    (0x119ffb, 0x0, {"ASIMDDP": True, "SVE": False, "I8MM": False}),
    (0xecfffffb, 0x7f877fff, {"ASIMDDP": True, "SVE": True, "I8MM": True}),
])
def test_arm_hwcaps_from_the_auxiliary_vector(hwcap, hwcap2, want):
    assert cpu_path.arm_hwcaps(_auxv(hwcap, hwcap2)) == want


def test_the_probe_names_this_machine_and_says_what_it_saw():
    p = cpu_path.probe()
    assert p.runtime == f"onnxruntime {paths.ORT_VERSION}"
    assert p.u8s8_saturates in (True, False)
    assert p.description in p.describe()
    assert ("saturates u8×s8" in p.describe()) == p.u8s8_saturates


def test_pair_saturation_by_hand():
    a = np.full((1, 4), 255, np.uint8)
    b = np.full((4, 1), 127, np.int8)
    assert code_paths.u8s8_matmul(a, b).tolist() == [[2 * 32767]]
    assert K.matmul_integer(a, b).tolist() == [[255 * 127 * 4]]
    # 128 + 0 in a pair: 255 * 127 fits in int16, so (127, 0, 127, 0) is exact
    b2 = np.array([[127], [0], [127], [0]], np.int8)
    assert code_paths.u8s8_matmul(a, b2).tolist() == [[2 * 255 * 127]]
    # a negative pair saturates at -32768; zero points are applied after, exactly
    b3 = np.full((2, 1), -128, np.int8)
    az = np.array(np.uint8(10))
    got = code_paths.u8s8_matmul(a[:, :2], b3, az, np.array(np.int8(0)))
    assert got.tolist() == [[-32768 + 10 * 256]]
    # odd K: the last product pairs with zero
    assert code_paths.u8s8_matmul(a[:, :3], b[:3]).tolist() == [[32767 + 255 * 127]]


def _conv_ones(c: int, kw: int, where: list[tuple[int, int]]) -> np.ndarray:
    w = np.zeros((2, c, 1, kw), np.int8)  # two output channels: not depthwise
    for ch, k in where:
        w[:, ch, 0, k] = 127
    return w


@pytest.mark.parametrize(("c", "kw", "where", "saturates"), [
    # measured on onnxruntime 1.32.0 under qemu -cpu Haswell (docs/semantics.md): the
    # window is laid out kernel positions first, channels innermost, and paired (0,1), …
    (2, 1, [(0, 0), (1, 0)], True),
    (4, 1, [(1, 0), (2, 0)], False),
    (2, 2, [(0, 0), (0, 1)], False),
    (3, 2, [(2, 0), (0, 1)], True),
    (3, 2, [(1, 0), (2, 0)], False),
])
def test_conv_pairs_channels_innermost(c, kw, where, saturates):
    x = np.full((1, c, 1, kw), 255, np.uint8)
    w = _conv_ones(c, kw, where)
    got = code_paths.u8s8_conv(x, w)
    exact = K.conv_integer(x, w)
    assert (got != exact).any() == saturates
    if saturates:
        assert int(got.ravel()[0]) == 32767


def test_depthwise_conv_is_exact():
    x = np.full((1, 2, 1, 2), 255, np.uint8)
    w = np.full((2, 1, 1, 2), 127, np.int8)
    assert np.array_equal(code_paths.u8s8_conv(x, w, group=2), K.conv_integer(x, w, group=2))


def test_onnxruntime_through_this_paths_entry():
    # Random u8 × s8 codes with zero points: onnxruntime gives the spec here, or, where
    # an entry applies, the entry's emulation bit for bit (and then not the spec).
    r = np.random.default_rng(7)
    a = r.integers(0, 256, (9, 37)).astype(np.uint8)
    b = r.integers(-128, 128, (37, 5)).astype(np.int8)
    az, bz = np.array(np.uint8(131)), np.array(np.int8(-3))
    model = one_node("MatMulInteger", [("in_a", a), ("b", b), ("az", az), ("bz", bz)],
                     TP.INT32)
    got = run_ort(model, {"in_a": a})[0]
    spec = K.matmul_integer(a, b, az, bz)
    if paths.entry("u8s8-pair-saturation") is None:
        assert np.array_equal(got, spec)
    else:
        assert np.array_equal(got, code_paths.u8s8_matmul(a, b, az, bz))
        assert not np.array_equal(got, spec)


def test_every_entry_is_keyed_by_known_paths_and_measured_releases():
    for d in code_paths.DEVIATIONS:
        assert set(d.paths) <= set(cpu_path.DESCRIPTIONS), d.key
        assert d.releases and all(r.count(".") == 1 for r in d.releases)
        assert d.measured and d.ops
        # a size for every entry but the one check reruns with its exact emulation, and
        # the one no output of check MODEL shows (a MatMulNBits probe of an identity A sums
        # zeros; check --against passes it to the reference evaluator)
        assert (d.ulps is None and d.steps is None) == (
            d.key in ("u8s8-pair-saturation", "neon-fp16-matmulnbits"))


def _mm_model():
    r = np.random.default_rng(3)
    a = r.integers(0, 256, (4, 6)).astype(np.uint8)
    b = r.integers(-128, 128, (6, 3)).astype(np.int8)
    m = one_node("MatMulInteger", [("a", a), ("b", b)], TP.INT32)
    m.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4
    m.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 3
    return m


@pytest.mark.parametrize(("path", "status"), [("x86-64-avx2", "runtime-deviation"),
                                              ("x86-64-avx512-vnni", "mismatch")])
def test_check_passes_a_difference_only_where_the_paths_entry_explains_it(
        path, status, monkeypatch):
    # The kernel made to differ from onnxruntime on every machine; the probed path set
    # by hand: a known deviation passes with its name and size, anything else fails.
    import dqtool

    exact = K.integer_matmul
    saturates = cpu_path.probe().u8s8_saturates  # what this machine's onnxruntime does
    real = code_paths.u8s8_matmul
    monkeypatch.setattr(code_paths, "u8s8_matmul", lambda a, b, az=None, bz=None: (
        real(a, b, az, bz) if saturates else exact(a, az, b, bz)))
    monkeypatch.setattr(K, "integer_matmul", lambda *a: exact(*a) + 1)
    monkeypatch.setattr(cpu_path, "probe", lambda: cpu_path.CpuPath(path, None, "test"))
    monkeypatch.setattr("dqtool.runtimes.onnxruntime.installed_version", lambda: "1.32.0")
    report = dqtool.check(_mm_model())
    (node,) = [n for n in report.nodes if "MatMulInteger" in n.op]
    assert node.status == status
    assert report.passed == (status == "runtime-deviation")
    if status == "runtime-deviation":
        assert "saturates u8×s8 pair sums in int16" in node.reason
        assert "at most 1 step(s) from the spec" in node.reason

"""Seeded inputs for a model, from its input types and shapes.

Symbolic or unknown dimensions come from ``shapes`` (an input's whole shape by its name, or
one symbolic dimension by its name) or else the stated default, ``DEFAULT_DIM``. Float
inputs are standard normal (the range a QuantizeLinear of activations usually covers);
integers are uniform over a small range that stays valid for index-like inputs.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from dqtool import registry, types
from dqtool.errors import InputError, UsageError

DEFAULT_DIM = 1
STRING = "string"  # an InputSpec's type_name for a string input
# What ``check`` generates at most, over all inputs: 256 MiB of input data (e.g. 64 Mi
# float32). The values are drawn in their own type, so this is also what they cost; a
# model declaring more (an int8[2^30] input in a 200-byte file) is refused with the
# reason, not allocated. Bigger feeds can be given with --inputs.
MAX_GENERATED_BYTES = 256 << 20


@dataclass(frozen=True)
class InputSpec:
    name: str
    type_name: str
    dims: tuple[int | str | None, ...]


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs a caller must feed (an initializer-backed input has a default)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input '{vi.name}' is not a tensor; dqtool check feeds tensors "
                             "only")
        et = types.from_onnx_int(tt.elem_type)
        if tt.elem_type == onnx.TensorProto.STRING:  # given with --inputs, never generated
            et = None
            type_name = STRING
        elif et is None:
            kind = onnx.TensorProto.DataType.Name(tt.elem_type) if tt.elem_type in \
                onnx.TensorProto.DataType.values() else str(tt.elem_type)
            raise InputError(f"input '{vi.name}' is {kind}, which dqtool cannot generate")
        else:
            type_name = et.name
        dims: list[int | str | None] = []
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(d.dim_value)
                else:
                    dims.append(d.dim_param or None)
        out.append(InputSpec(vi.name, type_name, tuple(dims)))
    return out


def parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``NAME=D0,D1,...`` (an input's shape) or ``DIM=N`` (a symbolic dimension)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            value = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            value = None
        if not sep or not name or value is None or any(d < 0 for d in value):
            raise UsageError(f"--shape {item!r}: expected NAME=D0,D1,... with integer sizes")
        shapes[name] = value
    return shapes


def check_shape_names(specs: Sequence[InputSpec],
                      shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Every ``--shape`` name must be an input or a symbolic dimension of one: a typo
    would otherwise be ignored and the default size used."""
    inputs = [s.name for s in specs]
    dims = sorted({d for s in specs for d in s.dims if isinstance(d, str)})
    unknown = [n for n in shapes if n not in inputs and n not in dims]
    if unknown:
        raise UsageError(
            f"--shape {', '.join(unknown)}: the model has no such input or symbolic dimension "
            f"(inputs: {', '.join(inputs) or 'none'}; symbolic dimensions: "
            f"{', '.join(dims) or 'none'})")
    for name, value in shapes.items():
        if name not in inputs and len(value) != 1:
            raise UsageError(f"--shape {name}: a symbolic dimension takes one size "
                             f"({name}=N), got {len(value)}")


def check_given(spec: InputSpec, array: np.ndarray) -> np.ndarray:
    """An ``--inputs`` array must have the input's element type and fit its shape.

    ``numpy.savez`` stores ml_dtypes arrays (bfloat16, float8...) as raw bytes (``V2``,
    ``V1``); those are read back as the input's type. A string input takes an array of
    ``str`` or ``bytes`` (``numpy.savez`` stores them without pickling)."""
    if spec.type_name == STRING:
        if array.dtype.kind not in "US":
            raise UsageError(f"--inputs {spec.name}: {array.dtype} array, the model takes "
                             "string (an array of str)")
        if array.dtype.kind == "S":  # bytes: ONNX strings are UTF-8 text
            try:
                array = np.char.decode(array, "utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(f"--inputs {spec.name}: bytes that are not UTF-8 text "
                                 f"({e.reason} at byte {e.start}); ONNX strings are "
                                 "UTF-8") from None
        array = array.astype(str).astype(object)  # what onnxruntime takes for strings
        return _fits(spec, array)
    et = types.by_name(spec.type_name)
    want = np.dtype(et.dtype)
    if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize \
            and want.kind == "V":
        array = array.view(want)
    if array.dtype != want:
        raise UsageError(f"--inputs {spec.name}: {array.dtype} array, the model takes "
                         f"{spec.type_name} (numpy {want})")
    return _fits(spec, array)


def _fits(spec: InputSpec, array: np.ndarray) -> np.ndarray:
    if spec.dims and array.ndim != len(spec.dims):
        raise UsageError(f"--inputs {spec.name}: shape {tuple(array.shape)} has {array.ndim} "
                         f"dimensions, the input has {len(spec.dims)} {_dims(spec.dims)}")
    for i, (g, d) in enumerate(zip(array.shape, spec.dims, strict=False)):
        if isinstance(d, int) and d != g:
            raise UsageError(f"--inputs {spec.name}: shape {tuple(array.shape)}, the model "
                             f"fixes dimension {i} to {d} {_dims(spec.dims)}")
    return array


def _dims(dims: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def resolve_shape(spec: InputSpec, shapes: Mapping[str, tuple[int, ...]],
                  defaulted: list[str]) -> tuple[int, ...]:
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(spec.dims) and spec.dims:
            raise UsageError(f"--shape {spec.name}: {len(given)} dimensions given, the input "
                             f"has {len(spec.dims)}")
        for g, d in zip(given, spec.dims, strict=False):
            if isinstance(d, int) and d != g:
                raise UsageError(f"--shape {spec.name}: size {g} where the model fixes {d}")
        return given
    out = []
    for i, d in enumerate(spec.dims):
        if isinstance(d, int):
            out.append(d)
        elif d is not None and d in shapes and len(shapes[d]) == 1:
            out.append(shapes[d][0])
        else:
            defaulted.append(f"{spec.name}[{i}]" + (f" ({d})" if d else ""))
            out.append(DEFAULT_DIM)
    return tuple(out)


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Inputs that index a constant table (``Gather``, or a family's operator that gathers:
    ``Family.gathers``; the table an initializer or its DequantizeLinear): input name → the
    table's size along the gathered axis (the smallest, if several). An index drawn
    outside it would make every run fail."""
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:  # a dequantized table (upgrade's Gather) has its shape
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] in tables:
            tables.setdefault(node.output[0], tables[node.input[0]])
    inputs = {vi.name for vi in model.graph.input}
    out: dict[str, int] = {}
    for node in model.graph.node:
        if (node.domain, node.op_type) in (("", "Gather"), ("ai.onnx", "Gather")):
            key = "axis"
        else:
            family = registry.owner(node.domain or "ai.onnx", node.op_type)
            key = family.gathers.get(node.op_type) if family is not None else None
            if key is None:
                continue
        if len(node.input) < 2 or node.input[1] not in inputs or node.input[0] not in tables:
            continue
        dims = tables[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == key), 0)
        if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
            out[node.input[1]] = min(out.get(node.input[1], dims[axis]), dims[axis])
    return out


def random_array(type_name: str, shape: tuple[int, ...], rng: np.random.Generator,
                 index_bound: int | None = None) -> np.ndarray:
    """Random values of the type: integers in [-8, 8] (within ``[-index_bound,
    index_bound - 1]`` for an index into a table of that size), floats standard normal."""
    et = types.by_name(type_name)
    if type_name == "bool":
        return rng.integers(0, 2, shape, dtype=np.bool_)
    if et.is_integer:
        lo, hi = max(int(et.min), -8), min(int(et.max), 8)
        if index_bound is not None:
            lo, hi = max(lo, -index_bound), min(hi, index_bound - 1)
        if et.dtype.kind in "iu":  # drawn in the type itself: no int64 array 8x the size
            return rng.integers(lo, hi + 1, shape, dtype=et.dtype)
        return rng.integers(lo, hi + 1, shape, dtype=np.int8).astype(et.dtype)
    if et.dtype == np.float64:
        return rng.standard_normal(shape)
    return rng.standard_normal(shape, dtype=np.float32).astype(et.dtype, copy=False)


def describe_values(type_name: str, index_bound: int | None = None) -> str:
    """What ``random_array`` draws for an input, in words (the report says how each input
    was made, and why its values keep the outputs finite)."""
    if type_name == STRING:
        return "given"
    et = types.by_name(type_name)
    if type_name == "bool":
        return "uniform over false, true"
    if et.is_integer:
        lo, hi = max(int(et.min), -8), min(int(et.max), 8)
        if index_bound is not None:
            lo, hi = max(lo, -index_bound), min(hi, index_bound - 1)
            return (f"integers uniform in [{lo}, {hi}]: indices into a table of "
                    f"{index_bound} rows, every one inside it")
        return f"integers uniform in [{lo}, {hi}]"
    return "standard normal"


def generate(model: onnx.ModelProto, *, seed: int = 0,
             shapes: Mapping[str, tuple[int, ...]] | None = None,
             given: Mapping[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray],
                                                                      list[str]]:
    """Feeds for every input (``given`` ones used as they are) and the dimensions that
    took the default size."""
    shapes = dict(shapes or {})
    given = dict(given or {})
    specs = model_inputs(model)
    known = {s.name for s in specs}
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"--inputs names {', '.join(unknown)}, which the model does not take "
                         f"(inputs: {', '.join(sorted(known)) or 'none'})")
    check_shape_names(specs, shapes)
    for spec in specs:
        if spec.name in given:
            given[spec.name] = check_given(spec, given[spec.name])
            if spec.name in shapes and tuple(shapes[spec.name]) != given[spec.name].shape:
                raise UsageError(f"--shape {spec.name}: {shapes[spec.name]} differs from the "
                                 f"--inputs array's shape {given[spec.name].shape}")
    rng = np.random.default_rng(seed)
    bounds = index_bounds(model)
    feeds: dict[str, np.ndarray] = {}
    defaulted: list[str] = []
    generated = 0
    for spec in specs:
        # Draw for every input, even a given one, so a given input does not shift the
        # values the others get for a seed.
        shape = given[spec.name].shape if spec.name in given else resolve_shape(
            spec, shapes, defaulted)
        n = int(np.prod(shape, dtype=object))
        if spec.type_name == STRING:
            if spec.name not in given:
                raise InputError(f"input '{spec.name}' is STRING, which dqtool cannot "
                                 f"generate; give it with --inputs (numpy.savez(path, "
                                 f"{spec.name}=an array of str))")
            feeds[spec.name] = given[spec.name]
            continue
        if spec.name not in given:
            et = types.TYPES.get(spec.type_name)
            generated += n * (et.bits if et is not None else 64) // 8
            if generated > MAX_GENERATED_BYTES:
                raise InputError(  # the caller names the model
                    f"input {spec.name}: shape {tuple(shape)} ({n} elements) takes the inputs "
                    f"dqtool check generates past {MAX_GENERATED_BYTES >> 20} MiB; give "
                    "smaller sizes with --shape, or the arrays with --inputs")
        try:
            arr = random_array(spec.type_name, shape, rng, bounds.get(spec.name))
        except MemoryError:
            raise UsageError(f"input {spec.name}: not enough memory for shape "
                             f"{tuple(shape)}; give smaller sizes with --shape") from None
        feeds[spec.name] = given.get(spec.name, arr)
    return feeds, defaulted


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays by name from an ``.npz`` file (``numpy.savez``); anything else is refused."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an .npz file")
    if not zipfile.is_zipfile(p):
        raise InputError(f"{p}: not an .npz file (write one with numpy.savez(path, NAME=array))")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{p}: not a readable .npz file ({reason})") from None

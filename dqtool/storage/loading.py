"""Reading a model safely: the file, its protobuf and its external data checked before
anything is read (an unreadable or truncated file, external data that is missing, short,
or stored outside the model's folder, an opset newer than dqtool knows). Tensors stay
memory-mapped (onnx_ir); nothing is read that the caller does not ask for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from dqtool.errors import InputError
from dqtool.storage import (
    checked_files,
    inline_read,
    validation,
)

MAX_ONNX_OPSET = onnx.defs.onnx_opset_version()


def _iter_tensor_protos(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    def from_graph(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from g.initializer
        for node in g.node:
            yield from from_nodes([node])

    def from_nodes(nodes) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("g"):
                    yield from from_graph(a.g)
                for g in a.graphs:
                    yield from from_graph(g)

    yield from from_graph(model.graph)
    for fn in model.functions:
        yield from from_nodes(fn.node)


def _number(info: dict[str, str], key: str, path: Path, name: str) -> int | None:
    """An external-data ``offset`` or ``length``: absent, or a non-negative decimal integer."""
    text = info.get(key)
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit():
        raise InputError(f"{path}: tensor '{name}' has external-data {key} '{text}', which is "
                         "not a non-negative integer")
    return int(text)


SOURCES = "dqtool.sources"  # model.meta key: the files a loaded model reads


def _data_file(path: Path, base: Path, loc: str, name: str) -> tuple[Path, int]:
    """(the file, its size) an external-data ``location`` names, checked: inside the
    model's folder, a regular file, not hard-linked."""
    if os.path.isabs(loc) or Path(loc).drive:
        raise InputError(f"{path}: tensor '{name}' has an absolute external-data location "
                         f"'{loc}'; only paths inside the model's folder are read")
    lexical = Path(os.path.normpath(base / loc))
    if not lexical.is_relative_to(base):
        raise InputError(f"{path}: tensor '{name}' has external-data location '{loc}', "
                         "which escapes the model's folder")
    # Resolved as the operating system opens it: each symbolic link followed before the
    # '..' after it ('sub/../w.bin' through a link 'sub' leaves the folder, though its
    # lexical form does not). CVE-2024-27318 is this class.
    try:
        target = Path(os.path.realpath(base / loc, strict=True))
    except FileNotFoundError:
        raise InputError(f"{path}: external data '{loc}' of tensor '{name}' is missing")\
            from None
    except OSError as e:  # a symbolic-link loop, a name too long, a component not a folder
        raise InputError(f"{path}: external data '{loc}' of tensor '{name}' cannot be "
                         f"opened: {e.strerror or e}") from None
    if not target.is_relative_to(base):
        raise InputError(f"{path}: external data '{loc}' leads through a symbolic link to "
                         f"{target}, outside the model's folder; only files inside it are "
                         "read (copy the data next to the model)")
    if not target.is_file():
        raise InputError(f"{path}: external data '{loc}' of tensor '{name}' is missing")
    st = target.stat()
    try:  # the name as the system resolves it: realpath takes 'w.bin/..' for a folder
        raw = os.stat(base / loc)
    except OSError as e:
        raise InputError(f"{path}: external data '{loc}' of tensor '{name}' cannot be "
                         f"opened: {e.strerror or e}") from None
    if (raw.st_dev, raw.st_ino) != (st.st_dev, st.st_ino):
        raise InputError(f"{path}: external data '{loc}' changed while it was checked; "
                         "nothing was read")
    if st.st_nlink > 1:
        raise InputError(f"{path}: external data '{loc}' has {st.st_nlink} "
                         "hard links; hard-linked data is refused (a hard link can "
                         "bring in any file); copy it instead")
    # Opened now, the opened file checked, and read through it from here on: no name is
    # resolved again (``checked_files``).
    try:
        checked_files.open_checked(base, loc, target, st)
    except checked_files.Changed as e:
        raise InputError(f"{path}: external data '{loc}' changed while it was checked (now "
                         f"{e}); nothing was read") from None
    except OSError as e:
        raise InputError(f"{path}: external data '{loc}' of tensor '{name}' cannot be "
                         f"opened: {e.strerror or e}") from None
    return target, st.st_size


def _check_external(path: Path, model: onnx.ModelProto) -> set[Path]:
    """Check every external-data reference; return the data files the model reads."""
    base = path.parent.resolve()
    files: set[Path] = set()
    # A model's thousands of tensors name one or two files: each is checked once (its
    # path resolved, its status read: system calls per path component).
    checked: dict[str, tuple[Path, int]] = {}
    for t in _iter_tensor_protos(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        name = t.name or "<unnamed>"
        if not loc:
            raise InputError(f"{path}: tensor '{name}' is external but names no location")
        if "\0" in loc:
            raise InputError(f"{path}: tensor '{name}' has an external-data location with a "
                             "NUL character")
        if loc.endswith(("/", "\\")) or loc in (".", ".."):
            raise InputError(f"{path}: tensor '{name}' has external-data location '{loc}', "
                             "which names a folder, not a file")
        offset = _number(info, "offset", path, name) or 0
        length = _number(info, "length", path, name)
        try:
            expected = validation.expected_bytes(t)
        except validation.Invalid as e:
            raise InputError(f"{path}: tensor '{name}' {e}") from None
        if length is not None and expected is not None and length != expected:
            raise InputError(f"{path}: tensor '{name}' has external-data length {length}; "
                             f"its dims {list(t.dims)} and type need {expected} bytes")
        if loc not in checked:
            checked[loc] = _data_file(path, base, loc, name)
        target, size = checked[loc]
        need = length if length is not None else expected
        if need is not None and offset + need > size:
            raise InputError(f"{path}: external data '{loc}' is truncated: tensor '{name}' "
                             f"needs bytes {offset}..{offset + need}, the file has {size}")
        files.add(target)
    return files


def read_proto(path: str | os.PathLike,
               holes: inline_read.Holes | None = None) -> onnx.ModelProto:
    """The model's protobuf without tensor data from external files, checked for safety.
    ``holes``: see ``_read_proto``."""
    return _read_proto(path, holes)[0]


def _read_proto(path: str | os.PathLike, holes: inline_read.Holes | None = None,
                ) -> tuple[onnx.ModelProto, set[Path]]:
    """``holes``: a dict to receive the large initializers left in the file (see
    ``inline_read``); their raw data is then a mark in the returned protobuf."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an ONNX model file")
    lean = inline_read.read(p) if holes is not None else None
    if lean is not None:
        proto = lean[0]
        holes.update(lean[1])
        holes.source = lean[1].source
    else:
        try:
            proto = onnx.load_model(str(p), load_external_data=False)
        except (DecodeError, RuntimeError, ValueError, OSError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"{p}: not a readable ONNX model ({reason})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise InputError(f"{p}: not an ONNX model (no IR version, graph or opset import; "
                         "truncated or another kind of file)")
    validation.validate(p, proto, holes)
    return proto, _check_external(p, proto)


def inline_external(proto: onnx.ModelProto, base: Path, *,
                    subgraph_initializers: bool = False) -> None:
    """Read into the protobuf the external data of every tensor held by a node attribute (a
    Constant's value; in subgraphs and functions too) and, if asked, of subgraph
    initializers. Saving writes only initializers to external data, and the runtimes
    resolve only main-graph initializers from a folder; these tensors are small."""

    def tensor(t: onnx.TensorProto) -> None:
        if external_data_helper.uses_external_data(t):
            read_external(t, base)

    def nodes(node_list: Iterable[onnx.NodeProto]) -> None:
        for node in node_list:
            for attr in node.attribute:
                if attr.HasField("t"):
                    tensor(attr.t)
                for t in attr.tensors:
                    tensor(t)
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    graph(g)

    def graph(g: onnx.GraphProto) -> None:
        if subgraph_initializers:
            for t in g.initializer:
                tensor(t)
        nodes(g.node)

    nodes(proto.graph.node)
    for fn in proto.functions:
        nodes(fn.node)


def read_external(t: onnx.TensorProto, base: Path) -> None:
    """Read an external tensor's bytes into the protobuf, as onnx_ir reads them (a symbolic
    link inside the model's folder is followed; onnx's own loader refuses it, so the
    commands would disagree). The reference was checked when the model was read
    (``_check_external``): offset and length are integers, the length is the tensor's."""
    info = {e.key: e.value for e in t.external_data}
    offset = int(info.get("offset") or 0)
    length = info.get("length")
    need = int(length) if length else validation.expected_bytes(t)
    with open(checked_files.read_path(base, info["location"]), "rb") as f:
        f.seek(offset)
        data = f.read() if need is None else f.read(need)
    t.raw_data = data
    t.data_location = onnx.TensorProto.DEFAULT
    del t.external_data[:]


def read_all_external(proto: onnx.ModelProto, base: Path) -> None:
    """Read every external tensor of the model into the protobuf (see ``read_external``)."""
    for t in _iter_tensor_protos(proto):
        if external_data_helper.uses_external_data(t):
            read_external(t, base)


def load(path: str | os.PathLike) -> ir.Model:
    """Load a model with external data memory-mapped (read lazily), and the large raw
    tensors of an inline model left in its file (see ``inline_read``); tensors held by
    node attributes are read in (see ``inline_external``)."""
    holes = inline_read.Holes()
    proto, data_files = _read_proto(path, holes)
    inline_external(proto, Path(path).parent)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx_ir raises many types on malformed protos
        if not holes:
            raise InputError(f"{path}: malformed ONNX model ({e})") from None
        model = None
    del proto
    if holes and (model is None or not inline_read.attach(model, holes)):
        return _load_whole(path)
    return _finish_load(model, path, data_files)


def _load_whole(path: str | os.PathLike) -> ir.Model:
    proto, data_files = _read_proto(path)
    inline_external(proto, Path(path).parent)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx_ir raises many types on malformed protos
        raise InputError(f"{path}: malformed ONNX model ({e})") from None
    return _finish_load(model, path, data_files)


def _finish_load(model: ir.Model, path: str | os.PathLike, data_files: set[Path]) -> ir.Model:
    ir.external_data.set_base_dir(model.graph, Path(path).parent)
    checked_files.bind(model.graph, Path(path).parent)
    # Saving must never replace a file this model still reads (see ``save``).
    model.meta[SOURCES] = (Path(path).resolve(), frozenset(data_files))
    return model


# Element types newer than some opsets' IR: a value of one needs the IR that introduced it.

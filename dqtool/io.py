"""Reading models safely and writing them atomically.

Loading checks what would otherwise fail late or dangerously: an unreadable or truncated
file, external data that is missing, short, or stored outside the model's folder, an opset
newer than dqtool knows. Tensors stay memory-mapped (onnx_ir); nothing is read that the
caller does not ask for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from dqtool import (
    checked_files,
    commit,
    early_copy,
    external_data,
    inline_load,
    inline_save,
    types,
    validation,
)
from dqtool.errors import DqtoolError, InputError, OutputError, UsageError

MAX_ONNX_OPSET = onnx.defs.onnx_opset_version()
# A protobuf message cannot pass 2 GiB; leave room for the graph itself.
INLINE_LIMIT = 1_800_000_000


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
               holes: inline_load.Holes | None = None) -> onnx.ModelProto:
    """The model's protobuf without tensor data from external files, checked for safety.
    ``holes``: see ``_read_proto``."""
    return _read_proto(path, holes)[0]


def _read_proto(path: str | os.PathLike, holes: inline_load.Holes | None = None,
                ) -> tuple[onnx.ModelProto, set[Path]]:
    """``holes``: a dict to receive the large initializers left in the file (see
    ``inline_load``); their raw data is then a mark in the returned protobuf."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an ONNX model file")
    lean = inline_load.read(p) if holes is not None else None
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
    tensors of an inline model left in its file (see ``inline_load``); tensors held by
    node attributes are read in (see ``inline_external``)."""
    holes = inline_load.Holes()
    proto, data_files = _read_proto(path, holes)
    inline_external(proto, Path(path).parent)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # onnx_ir raises many types on malformed protos
        if not holes:
            raise InputError(f"{path}: malformed ONNX model ({e})") from None
        model = None
    del proto
    if holes and (model is None or not inline_load.attach(model, holes)):
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
_TYPE_IR = {"float8e4m3fn": 9, "float8e4m3fnuz": 9, "float8e5m2": 9, "float8e5m2fnuz": 9,
            "int4": 10, "uint4": 10, "float4e2m1": 11, "float8e8m0": 12, "int2": 13,
            "uint2": 13, "float6e2m3": 14, "float6e3m2": 14}


def lowest_ir_version(model: ir.Model) -> int:
    """The lowest IR version that the model's opsets (every domain onnx knows: ai.onnx,
    ai.onnx.ml, training, preview) and element types need."""
    opsets: dict[str, int] = {}
    for imports in [model.opset_imports, *(f.opset_imports for f in model.functions.values())]:
        for domain, version in imports.items():
            domain = "" if domain == "ai.onnx" else domain
            opsets[domain] = max(opsets.get(domain, 0), version)
    table = onnx.helper.OP_SET_ID_VERSION_MAP
    known = {d or "ai.onnx" for d, _ in table}
    if any((d or "ai.onnx") in known and (d or "ai.onnx", v) not in table
           for d, v in opsets.items()):
        ir_version = onnx.IR_VERSION  # an opset newer than the installed onnx's table
    else:
        ir_version = onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()], ignore_unknown=True)
    for dtype in _dtypes(model):
        ir_version = max(ir_version, _TYPE_IR.get(types.name_of(dtype) or "", 0))
    # Fields newer than the opsets may need: function overloads and node metadata came with
    # IR 10, model-local functions with IR 7; before IR 4 every initializer had to be a
    # graph input.
    if any(f.overload for f in model.functions.values()) or _any_node_metadata(model):
        ir_version = max(ir_version, 10)
    if model.functions:
        ir_version = max(ir_version, 7)
    if any(not set(g.initializers.values()) <= set(g.inputs) for g in model.graphs()):
        ir_version = max(ir_version, 4)
    return ir_version


def _any_node_metadata(model: ir.Model) -> bool:
    return any(node.metadata_props for root in [model.graph, *model.functions.values()]
               for node in ir.traversal.RecursiveGraphIterator(root))


def _dtypes(model: ir.Model) -> Iterator[ir.DataType]:
    """The element type of every typed value and constant of every graph and function."""
    for g in model.graphs():  # the main graph and its subgraphs
        for v in [*g.inputs, *g.outputs, *g.initializers.values()]:
            if v.dtype is not None:
                yield v.dtype
    for root in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(root):
            for v in node.outputs:
                if v.dtype is not None:
                    yield v.dtype
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and not attr.is_ref():
                    yield attr.value.dtype


def tensor_bytes(model: ir.Model) -> int:
    return sum(
        v.const_value.nbytes
        for g in model.graphs()
        for v in g.initializers.values()
        if v.const_value is not None
    )


def uses_external_data(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor)
        for g in model.graphs()
        for v in g.initializers.values()
    )


def external_choice(model: ir.Model, external: bool | None) -> bool:
    """Whether ``save(model, external=external)`` writes external data: as asked, or else
    when the input used it (the file it was loaded from read data files, even if every
    such tensor has since been replaced) or the tensors would pass protobuf's 2 GiB limit."""
    if external is not None:
        return external
    sources = model.meta.get(SOURCES)
    loaded_external = sources is not None and bool(sources[1])
    return loaded_external or uses_external_data(model) or tensor_bytes(model) > INLINE_LIMIT


def save(
    model: ir.Model,
    out: str | os.PathLike,
    *,
    external: bool | None = None,
    shard_size: int | None = None,
    callback: Callable | None = None,
    verify: Callable[[Path], None] | None = None,
    prefill: external_data.Prefill | external_data.Eager | None = None,
    while_writing: Callable[[], None] | None = None,
) -> list[Path]:
    """Write ``model`` to ``out`` atomically; returns the files written.

    ``verify(path)`` is called with the written model's temporary path before anything is
    renamed into place; if it raises, nothing is written.

    ``external=None`` chooses: external data (``<name>.data`` next to ``out``, or
    ``<name>.<token>.data`` while a file has that name) when the input used it or the
    tensors would pass protobuf's 2 GiB limit. Everything is written into a temporary
    folder beside ``out`` and committed with the model file renamed last (see
    ``commit``): a failure or a crash leaves the old output whole, or the new one.
    ``prefill`` (from ``start_prefill``, before the model was changed) is that folder with
    the input's data already being copied in; or (from ``start_eager``) with the tensors
    the conversion made already being written. ``while_writing()`` is called once the
    model file is written, while its external data may still be (a command prints its
    summary meanwhile); nothing is in place yet.
    """
    out = output_path(out)
    external = external_choice(model, external)
    if prefill is not None:
        temp, data = prefill.temp, prefill.path.name
    else:
        parent = _output_folder(model, out)
        temp = _temp(parent, out)
        data = commit.data_name(parent, out.name)
    tmp = temp.path
    parent = tmp.parent
    try:
        if not (external and shard_size is None) and prefill is not None:
            prefill.finish(cancel=True)
            prefill.path.unlink()
            prefill = None
        if external and shard_size is None:
            with external_data.externalized(model, tmp, data, callback, prefill):
                ir.save(model, tmp / out.name)
                if while_writing is not None:  # the data's writers are still at work
                    while_writing()
        else:
            if external:
                ir.save(model, tmp / out.name, external_data=data,
                        max_shard_size_bytes=shard_size, callback=callback,
                        max_workers=2)
            else:
                _write_inline(model, tmp / out.name, out)
            if while_writing is not None:
                while_writing()
        empty = tmp / data
        if external and shard_size is None and empty.exists() and not empty.stat().st_size:
            empty.unlink()  # every tensor was small enough to stay inline: no empty file
        if verify is not None:
            verify(tmp / out.name)
        _refuse_overwriting_sources(model, out, [parent / out.name])
        return commit.commit(tmp, parent, out.name, keep=_kept(model, out))
    except OSError as e:
        if isinstance(e, DqtoolError):
            raise
        raise OutputError(e.errno, f"{out}: cannot write it ({e.strerror or e}); nothing "
                          "was written") from None
    finally:
        if prefill is not None:
            prefill.finish(cancel=True)
        temp.remove()


def _write_inline(model: ir.Model, path: Path, out: Path) -> None:
    """Stream the model to ``path``, over the input's copy when one was started early for
    this output (``early_copy``) and it is still the file the model was loaded from."""
    sources = model.meta.get(SOURCES)
    early = early_copy.take(sources[0], out) if sources is not None else None
    if early is None:
        inline_save.write(model, path)
        return
    try:
        copied = early.finish()
        if copied is None:
            inline_save.write(model, path)
            return
        os.replace(early.path, path)
        inline_save.write(model, path, prefilled=copied)
    finally:
        early.discard()


def output_path(out: str | os.PathLike) -> Path:
    """``out`` as a path; a name ending in a separator asks for a folder, never a file."""
    text = os.fspath(out)
    if isinstance(text, str) and text.endswith((os.sep, "/")) and text.strip("/" + os.sep):
        if os.path.isdir(text):
            raise UsageError(f"{text}: is a directory; give an output file name")
        raise InputError(f"{text}: output folder {text} does not exist (and an output "
                         "ending in '/' names a folder, not a file)")
    return Path(text)


def _temp(parent: Path, out: Path) -> commit.Temp:
    try:
        return commit.Temp(parent, out.name)
    except OSError as e:
        raise InputError(f"{out}: cannot create a file in {out.parent} "
                         f"({e.strerror})") from None


def _kept(model: ir.Model, out: Path) -> list[Path]:
    """The input's files a save must never remove (all but an in-place save's own)."""
    sources = model.meta.get(SOURCES)
    if sources is None or out.resolve() == sources[0]:
        return []
    return [sources[0], *sources[1]]


def _output_folder(model: ir.Model, out: Path) -> Path:
    """The folder ``out`` goes in, once the request is known to be sound: refused before a
    byte is written (the names of shards are checked once known)."""
    parent = out.parent.resolve()
    if not parent.is_dir():
        raise InputError(f"{out}: output folder {out.parent} does not exist")
    commit.refuse_non_regular(out)
    _refuse_overwriting_sources(model, out, [parent / out.name, parent / f"{out.name}.data"])
    return parent


def start_prefill(model: ir.Model, out: str | os.PathLike) -> external_data.Prefill | None:
    """Start copying the model's external data file to where ``save(model, out)`` will
    write it, before the model is changed (see ``external_data.Prefill``); None when the
    model's large tensors are not all in one data file. The caller passes the result to
    ``save``, or calls ``discard_prefill`` if it will not save."""
    paths = external_data.Resolver()
    sources = {paths[str(v.const_value.path)] for g in model.graphs()
               for v in g.initializers.values()
               if isinstance(v.const_value, ir.ExternalTensor)
               and v.const_value.nbytes > external_data.SIZE_THRESHOLD}
    if len(sources) != 1:
        return None
    out = output_path(out)
    parent = _output_folder(model, out)
    temp = _temp(parent, out)
    try:
        prefill = external_data.Prefill(sources.pop(), temp.path,
                                        commit.data_name(parent, out.name))
        prefill.temp = temp
        prefill.start()
    except BaseException:
        temp.remove()
        raise
    return prefill


def start_eager(model: ir.Model, out: str | os.PathLike, callback: Callable | None = None
                ) -> external_data.Eager:
    """Start the writers of ``save(model, out)``'s data file before the model is converted
    (see ``external_data.Eager``). The caller converts the model inside
    ``external_data.writing_early(eager)`` and passes the result to ``save`` as its
    ``prefill``, or calls ``discard_prefill`` if it will not save. ``callback``: the
    save's progress callback (called from the first tensor on)."""
    out = output_path(out)
    parent = _output_folder(model, out)
    temp = _temp(parent, out)
    try:
        eager = external_data.Eager(temp.path, commit.data_name(parent, out.name), callback)
        eager.temp = temp
    except BaseException:
        temp.remove()
        raise
    return eager


def discard_prefill(prefill: external_data.Prefill | external_data.Eager | None) -> None:
    if prefill is not None:
        prefill.finish(cancel=True)
        prefill.temp.remove()


def _refuse_overwriting_sources(model: ir.Model, out: Path, targets: list[Path]) -> None:
    """Replacing a file the loaded model reads would break the input (its external data
    would change under it). Only an in-place save, which replaces the model file itself and
    was approved by the caller (``no_overwrite_of_input``), may replace its data files."""
    sources = model.meta.get(SOURCES)
    if sources is None:
        return
    model_file, data_files = sources
    if out.resolve() == model_file:
        return
    for t in targets:
        if t.resolve() == model_file or t.resolve() in data_files:
            raise UsageError(f"{out}: writing it would replace {t}, which the input model "
                             f"{model_file.name} reads; choose another output name or folder")


def no_overwrite_of_input(src: str | os.PathLike, out: str | os.PathLike,
                          in_place: bool) -> None:
    """Refuse to write over the input unless asked to (``--in-place``)."""
    if not in_place and Path(out).resolve() == Path(src).resolve():
        raise UsageError(f"{out}: output is the input; pass --in-place to overwrite it")

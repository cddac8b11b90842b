"""Writing a model atomically: its files written beside the output, then committed as one
(``commit``); inline models streamed (``inline_write``), external data written by two
threads (``data_writer``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir

from dqtool.errors import DqtoolError, InputError, OutputError, UsageError
from dqtool.storage import (
    commit,
    data_writer,
    early_copy,
    inline_write,
)
from dqtool.storage.loading import SOURCES

# A protobuf message cannot pass 2 GiB; leave room for the graph itself.
INLINE_LIMIT = 1_800_000_000


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
    early: data_writer.DataFileCopy | data_writer.EarlyWriter | None = None,
    while_writing: Callable[[], None] | None = None,
    started_copy: early_copy.EarlyCopy | None = None,
) -> list[Path]:
    """Write ``model`` to ``out`` atomically; returns the files written.

    ``verify(path)`` is called with the written model's temporary path before anything is
    renamed into place; if it raises, nothing is written.

    ``external=None`` chooses: external data (``<name>.data`` next to ``out``, or
    ``<name>.<token>.data`` while a file has that name) when the input used it or the
    tensors would pass protobuf's 2 GiB limit. Everything is written into a temporary
    folder beside ``out`` and committed with the model file renamed last (see
    ``commit``): a failure or a crash leaves the old output whole, or the new one.
    ``early`` (from ``start_data_copy``, before the model was changed) is that folder with
    the input's data already being copied in; or (from ``start_early_writer``) with the
    tensors the conversion made already being written. ``while_writing()`` is called once the
    model file is written, while its external data may still be (a command prints its
    summary meanwhile); nothing is in place yet. ``started_copy``: a copy of the input
    started as the command began (``early_copy.start_early_copy``), which an inline model
    is written over where it still matches.
    """
    out = output_path(out)
    external = external_choice(model, external)
    if early is not None:
        temp, data = early.temp, early.path.name
    else:
        parent = _output_folder(model, out, external)
        temp = _temp(parent, out)
        data = commit.data_name(parent, out.name)
    tmp = temp.path
    parent = tmp.parent
    try:
        if not (external and shard_size is None) and early is not None:
            early.finish(cancel=True)
            early.path.unlink()
            early = None
        if external and shard_size is None:
            with data_writer.externalized(model, tmp, data, callback, early):
                ir.save(model, tmp / out.name)
                if while_writing is not None:  # the data's writers are still at work
                    while_writing()
        else:
            if external:
                ir.save(model, tmp / out.name, external_data=data,
                        max_shard_size_bytes=shard_size, callback=callback,
                        max_workers=2)
            else:
                _write_inline(model, tmp / out.name, out, started_copy)
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
        if early is not None:
            early.finish(cancel=True)
        temp.remove()


def _write_inline(model: ir.Model, path: Path, out: Path,
                  started_copy: early_copy.EarlyCopy | None) -> None:
    """Stream the model to ``path``, over ``started_copy`` when it is the input's copy
    started early for this output (``early_copy``) and still the file the model was loaded
    from."""
    sources = model.meta.get(SOURCES)
    early = started_copy if sources is not None and started_copy is not None \
        and started_copy.serves(sources[0], out) else None
    if early is None:
        inline_write.write(model, path)
        return
    try:
        copied = early.finish()
        if copied is None:
            inline_write.write(model, path)
            return
        os.replace(early.path, path)
        inline_write.write(model, path, copied=copied)
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


def _output_folder(model: ir.Model, out: Path, external: bool = True) -> Path:
    """The folder ``out`` goes in, once the request is known to be sound: refused before a
    byte is written (the names of shards are checked once known). ``external``: the save
    writes external data."""
    parent = out.parent.resolve()
    if not parent.is_dir():
        raise InputError(f"{out}: output folder {out.parent} does not exist")
    if external:
        _refuse_non_text_location(out)
    commit.refuse_non_regular(out)
    _refuse_overwriting_sources(model, out, [parent / out.name, parent / f"{out.name}.data"])
    return parent


def _refuse_non_text_location(out: Path) -> None:
    """A data file's location is stored in the model as text (a protobuf string, which is
    UTF-8) and made from the output's name: a name with bytes that are not UTF-8 (a shell
    passes them through) has no location that could be stored, and onnx_ir failed in the
    middle of the save. A model without external data is written under any name."""
    try:
        out.name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{out}: the name is not valid UTF-8, and the location of its "
                         "external data, stored in the model as text, is made from it; "
                         "choose a UTF-8 name; nothing was written") from None


def start_data_copy(model: ir.Model, out: str | os.PathLike) -> data_writer.DataFileCopy | None:
    """Start copying the model's external data file to where ``save(model, out)`` will
    write it, before the model is changed (see ``data_writer.DataFileCopy``); None when the
    model's large tensors are not all in one data file. The caller passes the result to
    ``save``, or calls ``discard_early`` if it will not save."""
    paths = data_writer.Resolver()
    sources = {paths[str(v.const_value.path)] for g in model.graphs()
               for v in g.initializers.values()
               if isinstance(v.const_value, ir.ExternalTensor)
               and v.const_value.nbytes > data_writer.SIZE_THRESHOLD}
    if len(sources) != 1:
        return None
    out = output_path(out)
    parent = _output_folder(model, out)
    temp = _temp(parent, out)
    try:
        early = data_writer.DataFileCopy(sources.pop(), temp.path,
                                         commit.data_name(parent, out.name))
        early.temp = temp
        early.start()
    except BaseException:
        temp.remove()
        raise
    return early


def start_early_writer(model: ir.Model, out: str | os.PathLike,
                       callback: Callable | None = None) -> data_writer.EarlyWriter:
    """Start the writers of ``save(model, out)``'s data file before the model is converted
    (see ``data_writer.EarlyWriter``). The caller hands it to the conversion (which
    submits each tensor that streams itself as it is made) and passes the result to
    ``save`` as its ``early``, or calls ``discard_early`` if it will not save.
    ``callback``: the save's progress callback (called from the first tensor on)."""
    out = output_path(out)
    parent = _output_folder(model, out)
    temp = _temp(parent, out)
    try:
        writer = data_writer.EarlyWriter(temp.path, commit.data_name(parent, out.name), callback)
        writer.temp = temp
    except BaseException:
        temp.remove()
        raise
    return writer


def discard_early(early: data_writer.DataFileCopy | data_writer.EarlyWriter | None) -> None:
    if early is not None:
        early.finish(cancel=True)
        early.temp.remove()


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

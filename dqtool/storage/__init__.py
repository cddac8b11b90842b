"""Storage: reading a model safely and writing it atomically, whatever its size.

This package's names are the interface the rest of dqtool uses: no module outside it
imports one of its modules (``.importlinter``, "storage is reached through its interface").
What it offers:

- loading: ``load``, ``read_proto``, ``read_all_external``, ``inline_external``,
  ``MAX_ONNX_OPSET``, ``SOURCES``; a large inline model's tensors left in its file
  (``MappedTensor``, ``Holes``, ``mark_of``) and external data bound to checked
  descriptors (``bind``, ``external_like``);
- saving: ``save`` and its choices (``external_choice``, ``output_path``,
  ``no_overwrite_of_input``, ``uses_external_data``, ``tensor_bytes``, ``INLINE_LIMIT``,
  ``lowest_ir_version``), the data file started before a transform (``start_data_copy``,
  ``start_early_writer``, ``EarlyWriter``, ``discard_early``), the early copy of a large
  inline input (``start_early_copy``, an ``EarlyCopy``), and the data files a
  model file names (``locations``);
- the one driver of every writing command: ``request``, ``Request``, ``Job``,
  ``Writing``, ``Verifier`` (``Check``, its old name, while dqtool/integer/api.py uses it);
- a constant's values read without keeping its file mapped (``tensor_array``,
  ``stored_values``, ``raw_bytes``, ``same_bytes``, ``int_array``, ``widened``,
  ``WidenedCodes``, ``unpack``, ``file_range``, ``from_file``, ``file_codes``);
- writing in pieces (``piecewise``, ``pwrite_all``, ``write_tensor``, ``Pieces``).

Each name is imported from its module when first read, as ``dqtool``'s own API is, so
that importing the package loads none of them (nor NumPy or onnx_ir): ``dqtool
--version`` reads ``dqtool.native``, which names ``pwrite_all``.

Its modules, bottom up: ``validation`` (a protobuf's fields), ``checked_files`` (external
data opened once), ``inline_read``/``inline_write`` (large inline tensors left in and
streamed to files), ``write_pieces``, ``data_writer`` (external data files),
``tensor_reads`` (a constant's values without keeping its file mapped), ``file_identity``
(what tells a file from its replacement), ``data_readers``, ``leftovers`` and ``commit``
(what a save may remove, crash recovery, the atomic commit), ``early_copy``, ``loading``,
``saving``, ``ir_version``, and ``driver``: load → transform → check → save, the one way
every writing command runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dqtool.storage.checked_files import bind, external_like
    from dqtool.storage.commit import locations
    from dqtool.storage.data_writer import EarlyWriter
    from dqtool.storage.driver import Job, Request, Verifier, Writing, request
    from dqtool.storage.early_copy import EarlyCopy, start_early_copy
    from dqtool.storage.inline_read import Holes, MappedTensor, mark_of
    from dqtool.storage.ir_version import lowest_ir_version
    from dqtool.storage.loading import (
        MAX_ONNX_OPSET,
        SOURCES,
        inline_external,
        load,
        read_all_external,
        read_proto,
    )
    from dqtool.storage.saving import (
        INLINE_LIMIT,
        discard_early,
        external_choice,
        no_overwrite_of_input,
        output_path,
        save,
        start_data_copy,
        start_early_writer,
        tensor_bytes,
        uses_external_data,
    )
    from dqtool.storage.tensor_reads import (
        WidenedCodes,
        file_codes,
        file_range,
        from_file,
        int_array,
        raw_bytes,
        same_bytes,
        stored_values,
        tensor_array,
        unpack,
        widened,
    )
    from dqtool.storage.write_pieces import Pieces, piecewise, pwrite_all, write_tensor

# name -> the module of this package that defines it.
_MODULES = {
    "checked_files": ("bind", "external_like"),
    "commit": ("locations",),
    "data_writer": ("EarlyWriter",),
    "driver": ("Job", "Request", "Verifier", "Writing", "request"),
    "early_copy": ("EarlyCopy", "start_early_copy"),
    "inline_read": ("Holes", "MappedTensor", "mark_of"),
    "ir_version": ("lowest_ir_version",),
    "loading": ("MAX_ONNX_OPSET", "SOURCES", "inline_external", "load", "read_all_external",
                "read_proto"),
    "saving": ("INLINE_LIMIT", "discard_early", "external_choice", "no_overwrite_of_input",
               "output_path", "save", "start_early_writer", "start_data_copy",
               "tensor_bytes", "uses_external_data"),
    "tensor_reads": ("WidenedCodes", "file_codes", "file_range", "from_file", "int_array",
                     "raw_bytes", "same_bytes", "stored_values", "tensor_array", "unpack",
                     "widened"),
    "write_pieces": ("Pieces", "piecewise", "pwrite_all", "write_tensor"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "INLINE_LIMIT",
    "MAX_ONNX_OPSET",
    "SOURCES",
    "EarlyCopy",
    "EarlyWriter",
    "Holes",
    "Job",
    "MappedTensor",
    "Pieces",
    "Request",
    "Verifier",
    "WidenedCodes",
    "Writing",
    "bind",
    "discard_early",
    "external_choice",
    "external_like",
    "file_codes",
    "file_range",
    "from_file",
    "inline_external",
    "int_array",
    "load",
    "locations",
    "lowest_ir_version",
    "mark_of",
    "no_overwrite_of_input",
    "output_path",
    "piecewise",
    "pwrite_all",
    "raw_bytes",
    "read_all_external",
    "read_proto",
    "request",
    "same_bytes",
    "save",
    "start_data_copy",
    "start_early_copy",
    "start_early_writer",
    "stored_values",
    "tensor_array",
    "tensor_bytes",
    "unpack",
    "uses_external_data",
    "widened",
    "write_tensor",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dqtool.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

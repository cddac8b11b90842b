"""Storage: reading a model safely and writing it atomically, whatever its size.

The rest of dqtool reaches files only through this package's interface: ``load`` and
``read_proto`` (checked reading, external data memory-mapped through checked descriptors),
``save`` (streamed, committed as one), and the helpers below. Its modules, bottom up:
``validation`` (a protobuf's fields), ``checked_files`` (external data opened once),
``inline_read``/``inline_write`` (large inline tensors left in and streamed to files),
``write_pieces``, ``data_writer`` (external data files), ``tensor_reads`` (a constant's
values without keeping its file mapped), ``file_identity`` (what tells a file from its
replacement), ``data_readers``, ``leftovers`` and ``commit`` (what a save may remove, crash
recovery, the atomic commit), ``early_copy``, ``loading``,
``saving``, ``ir_version``, and ``driver``: load → transform → check → save, the one
way every writing command runs.
"""

from dqtool.storage.driver import Check, Job, Request, Writing, request
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
    discard_prefill,
    external_choice,
    no_overwrite_of_input,
    output_path,
    save,
    start_eager,
    start_prefill,
    tensor_bytes,
    uses_external_data,
)

__all__ = [
    "INLINE_LIMIT",
    "MAX_ONNX_OPSET",
    "SOURCES",
    "Check",
    "Job",
    "Request",
    "Writing",
    "discard_prefill",
    "external_choice",
    "inline_external",
    "load",
    "lowest_ir_version",
    "no_overwrite_of_input",
    "output_path",
    "read_all_external",
    "read_proto",
    "request",
    "save",
    "start_eager",
    "start_prefill",
    "tensor_bytes",
    "uses_external_data",
]

"""External data files: opened once, the opened file checked, and read through it.

A location is checked by resolving it as the operating system does (``loading._data_file``).
Checking a name and opening it later leaves a gap: another process could swap a component
for a symbolic link in between, and every later open by name resolves the path again. So
the file is opened once, and what was opened is checked (on Linux the kernel names the
opened file's path in ``/proc/self/fd/N``; its device and inode are compared with those
checked). Every later read of the tensor, by dqtool or by onnx_ir's memory map, goes
through ``/proc/self/fd/N``, which opens that same file whatever the names now say.

The descriptors stay open for the process's life: a command reads one model or two, whose
tensors name a handful of files (a sharded model some hundreds; the soft limit on open
files is raised towards the hard one when needed). Where ``/proc/self/fd`` is missing
(macOS, Windows) the checked path is read by name (docs/safety.md says so).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx_ir as ir

from dqtool.storage import tensor_reads
from dqtool.storage.file_identity import identity

_PROC = "/proc/self/fd"
# (resolved model folder, location as written) -> the path reads use
_READ_PATHS: dict[tuple[str, str], str] = {}
_FDS: dict[tuple[int, int], int] = {}  # (device, inode) -> an open descriptor of it


class Changed(Exception):
    """The file opened is not the one checked (a name was swapped in between)."""


def _proc() -> bool:
    return os.path.isdir(_PROC)


def open_checked(base: Path, loc: str, target: Path, st: os.stat_result) -> str:
    """Open ``target`` (``base/loc`` resolved and checked: inside ``base``, a regular file,
    its status ``st``) and check the opened file is it; the path later reads use."""
    key = (str(base), loc)
    if key in _READ_PATHS:
        return _READ_PATHS[key]
    if not _proc():
        _READ_PATHS[key] = str(target)
        return str(target)
    ident = (st.st_dev, st.st_ino)
    fd = _FDS.get(ident)
    if fd is None:
        fd = _open(target)
        try:
            opened = os.fstat(fd)
            where = os.readlink(f"{_PROC}/{fd}")
            if identity(opened, status_change=True) != identity(st, status_change=True) \
                    or Path(where) != target:
                raise Changed(where)
        except BaseException:
            os.close(fd)
            raise
        _FDS[ident] = fd
    _READ_PATHS[key] = f"{_PROC}/{fd}"
    return _READ_PATHS[key]


def _open(target: Path) -> int:
    # Not blocking (a FIFO swapped in must not hang the open), not following a link as the
    # last component (the checked target is a resolved path: a link there now was swapped in).
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(target, flags)
    except OSError as e:
        if e.errno != 24:  # EMFILE: too many open files
            raise
    _raise_open_files_limit()
    return os.open(target, flags)


def _raise_open_files_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else soft * 4
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def read_path(base: Path, loc: str) -> str:
    """The path to read ``base/loc`` through, once checked (else the name itself)."""
    return _READ_PATHS.get((str(base.resolve()), loc), str(base / loc))


class FileTensor(tensor_reads.InFile, ir.ExternalTensor):
    """An external tensor that reads a large tensor's values on its own map (``numpy()``:
    ``tensor_reads.file_values``, nothing kept): onnx_ir's reading maps the whole file
    and keeps the map and the values for as long as the model lives. A small one is read
    as onnx_ir reads it (the pages it keeps are few)."""

    __slots__ = ()

    def numpy(self) -> np.ndarray:
        arr = tensor_reads.file_values(self) if self.nbytes >= tensor_reads.MAP_BYTES \
            else None
        return arr if arr is not None else super().numpy()

    def retyped(self, dtype: ir.DataType, shape: ir.Shape) -> FileTensor:
        """The same bytes of the file read as another type and shape."""
        return FileTensor(self.location, self.offset, self.length, dtype, shape=shape,
                          name=self.name or "", base_dir=self.base_dir)


class CheckedTensor(FileTensor):
    """An external tensor read through the descriptor its file was checked by: its
    location and folder are the model's (saved as written), its ``path`` the descriptor's
    (every read, onnx_ir's memory map included, opens ``path``)."""

    __slots__ = ("_read_path",)

    def __init__(self, read_path: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._read_path = read_path

    @property
    def path(self) -> str:
        return self._read_path

    def _check_path_containment(self) -> None:
        # onnx_ir checks the names again (the location against the folder); the file was
        # checked once, as opened, and ``path`` is that very file: a name resolved now is
        # what could have been swapped.
        return

    def retyped(self, dtype: ir.DataType, shape: ir.Shape) -> CheckedTensor:
        return CheckedTensor(self.path, self.location, self.offset, self.length, dtype,
                             shape=shape, name=self.name or "", base_dir=self.base_dir)


def external_like(t: ir.ExternalTensor, offset: int | None, length: int | None,
                  dtype: ir.DataType, shape: ir.Shape) -> ir.ExternalTensor:
    """Another view of ``t``'s file (a byte range, a type), read as ``t`` is read."""
    kwargs = {"shape": shape, "name": t.name or "", "base_dir": t.base_dir}
    if isinstance(t, CheckedTensor):
        return CheckedTensor(t.path, t.location, offset, length, dtype, **kwargs)
    return ir.ExternalTensor(t.location, offset, length, dtype, **kwargs)


def bind(graph: ir.Graph, base: Path) -> None:
    """Point the external tensors of ``graph`` and its subgraphs (locations relative to
    ``base``) at the files checked for them, each read as ``FileTensor`` reads."""
    resolved = str(base.resolve())
    for g in (graph, *(s for s in graph.subgraphs())):
        for v in g.initializers.values():
            t = v.const_value
            if not isinstance(t, ir.ExternalTensor) or isinstance(t, FileTensor):
                continue
            path = _READ_PATHS.get((resolved, str(t.location)))
            kwargs = {"shape": t.shape, "name": t.name, "doc_string": t.doc_string,
                      "metadata_props": dict(t.metadata_props), "base_dir": t.base_dir}
            if path is None or path == str(Path(t.base_dir) / t.location):
                # read by its name (no /proc here), as onnx_ir checks it
                v.const_value = FileTensor(t.location, t.offset, t.length, t.dtype, **kwargs)
            else:
                v.const_value = CheckedTensor(path, t.location, t.offset, t.length, t.dtype,
                                              **kwargs)

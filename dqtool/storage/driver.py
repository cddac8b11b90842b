"""One driver for every command that writes a model (``upgrade``/``downgrade``, ``fold``,
``pack``, ``qdq``, ``qoperator``): load → transform → optional check → save, all or
nothing.

The command gives what is its own: the transform, the check (made before the transform,
from the model as loaded, and run on the result), and whether the output's data file may
start before the transform (``Early``). The driver does what is the same for all of them:
the request's rules (an output or ``in_place``, never the input by mistake), loading a
path, the external-data choice, the save, and cleaning up after a refusal: a transform or
a check that raises leaves nothing written, and the input is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import onnx_ir as ir

from dqtool.errors import UsageError
from dqtool.storage import data_writer
from dqtool.storage.early_copy import EarlyCopy
from dqtool.storage.loading import load
from dqtool.storage.saving import (
    discard_early,
    external_choice,
    no_overwrite_of_input,
    output_path,
    save,
    start_data_copy,
    start_early_writer,
    uses_external_data,
)

R = TypeVar("R")
ModelArg = ir.Model | str | os.PathLike
# Before the transform, what the output's data file may do: "copy" the input's data file
# (the transform keeps most bytes), "write" the tensors as the transform makes them (it
# replaces most), or None: wait for the save.
Early = Literal["copy", "write"] | None


@dataclass(frozen=True)
class Verifier:
    """A check made from the model as loaded: ``run(made, result)`` is called with the
    model made (or, ``from_files``, the path of the written model before it is renamed
    into place: for a model past protobuf's 2 GB limit) and the transform's result (to
    record the verdict in); it raises to refuse."""

    run: Callable[[ir.Model | Path, Any], None]
    from_files: bool = False



@dataclass(frozen=True)
class Writing:
    """How the output is written, the same for every command: ``external_data`` True
    forces external data, None (default) uses it when the input did or the output would
    pass ~1.8 GB; ``shard_size`` splits it into files of at most that many bytes;
    ``progress(tensor, info)`` is called per tensor written as external data."""

    external_data: bool | None = None
    shard_size: int | None = None
    progress: Callable | None = None
    # a copy of the input started as the command began (``start_early_copy``); the
    # caller discards it when the command ends
    started_copy: EarlyCopy | None = None

    def __post_init__(self) -> None:
        if self.shard_size is not None and self.shard_size <= 0:
            raise UsageError(f"--shard-size must be positive, got {self.shard_size}")

    def external(self) -> bool | None:
        return True if self.shard_size is not None else self.external_data


@dataclass(frozen=True)
class Request:
    """Where a command reads and writes: ``path`` the file read (None: a model object),
    ``out`` where the result goes (None: nowhere)."""

    path: Path | None
    out: Path | None
    in_place: bool = False

    @property
    def source(self) -> str:
        return "<model>" if self.path is None else str(self.path)


def request(model_or_path: ModelArg, out: str | os.PathLike | None, *, in_place: bool = False,
            default: Callable[[Path], Path] | None = None) -> Request:
    """The request's rules, checked before anything is read or written: ``in_place`` needs
    a path and no other output; the input is never the output unless ``in_place``. A path
    with no ``out`` is written to ``default(path)`` when given, else nowhere."""
    path = None if isinstance(model_or_path, ir.Model) else Path(model_or_path)
    if in_place:
        if path is None:
            raise UsageError("in_place needs a path")
        if out is not None and Path(out).resolve() != path.resolve():
            raise UsageError("--in-place writes over the input; do not also give -o")
        out = path
    if out is None and path is not None and default is not None:
        out = default(path)
    if out is not None and path is not None:
        no_overwrite_of_input(path, out, in_place)
    return Request(path, None if out is None else output_path(out), in_place)


@dataclass
class Job(Generic[R]):
    """One run of a writing command (see the module docstring).

    - ``transform(model, early) → (result, model to save)``: ``early`` is the save's
      ``EarlyWriter`` when ``early`` chose "write" (the transform hands it the tensors it
      makes), else None. It may raise to refuse: nothing is then written.
    - ``check(model as loaded) → Verifier``, or None: the verifier of the result.
    - ``early(model) → Early``: asked only when the output is written, unchecked and not
      sharded.
    - ``while_writing(result)``: once the model file is written, while its data may still
      be (a command prints its summary meanwhile).
    """

    transform: Callable[[ir.Model, data_writer.EarlyWriter | None], tuple[R, ir.Model]]
    writing: Writing = Writing()
    check: Callable[[ir.Model], Verifier] | None = None
    early: Callable[[ir.Model], Early] | None = None
    while_writing: Callable[[R], None] | None = None

    def run(self, model_or_path: ModelArg, req: Request) -> tuple[R, ir.Model, list[Path]]:
        """The result, the model it made and the files written (none when ``req.out`` is
        None)."""
        model = load(req.path) if req.path is not None else model_or_path
        assert isinstance(model, ir.Model)
        # Read before the transform replaces tensors: a model object that used external
        # data keeps it (an onnx_ir model does not say so once its tensors are new).
        used_external = external_choice(model, None)
        verify = self.check(model) if self.check is not None else None
        from_files = verify is not None and verify.from_files and req.out is not None
        early = self._start_early(model, req)
        try:
            result, made = self.transform(
                model, early if isinstance(early, data_writer.EarlyWriter) else None)
            if verify is not None and not from_files:
                verify.run(made, result)
        except BaseException:  # the save never started: its writers and folder go too
            discard_early(early)
            raise
        if req.out is None:
            return result, made, []
        external = self.writing.external()
        if external is None and used_external:
            external = True
        tell = self.while_writing
        written = save(made, req.out, external=external, shard_size=self.writing.shard_size,
                       callback=self.writing.progress,
                       verify=None if verify is None or not from_files else
                       lambda path: verify.run(path, result), early=early,
                       while_writing=None if tell is None else lambda: tell(result),
                       started_copy=self.writing.started_copy)
        return result, made, written

    def _start_early(self, model: ir.Model, req: Request
                     ) -> data_writer.DataFileCopy | data_writer.EarlyWriter | None:
        if req.out is None or self.check is not None or self.early is None \
                or self.writing.shard_size is not None:
            return None
        choice = self.early(model)
        if choice == "copy":
            return start_data_copy(model, req.out)
        if choice == "write" and req.path is not None and uses_external_data(model) \
                and self.writing.external_data is not False:
            return start_early_writer(model, req.out, self.writing.progress)
        return None

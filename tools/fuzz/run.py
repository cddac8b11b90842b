"""Running one case and judging what it did.

A run is judged clean only if all of these hold:
- it exits 0, 1 or 2 of its own accord: no signal, no hang (killed at the time limit),
  no traceback on stderr;
- exit 2 prints exactly one line, ``dqtool: error: FILE: problem``, FILE being a path the
  command was given;
- nothing but dqtool's own lines (``dqtool: ...``) reaches stderr: third-party loggers and
  Python warnings stay quiet (runs are made without ``-v``);
- exit 2 leaves every file as it was (nothing written, no leftover temporary folder);
- the input is never modified (except by ``--in-place`` on success);
- nothing outside the output's folder is created, changed or removed, and nothing that is
  not a regular file (a device, FIFO, socket, directory, a symlink to one) is replaced;
- no temporary folder (``.NAME.XXXX``) is left behind by a run that ended;
- what it prints (stdout and stderr) is UTF-8 holding no character ``str.isprintable``
  refuses but the newline, and no line starting ``Traceback`` that Python did not print
  (a hostile name printed raw): verdict "raw-control"; JSON output parses ("bad-json");
- a writer that succeeds leaves its output where it was named ("output-missing"), and
  every other model in the sandbox still reads the external data it read before
  ("other-model-broken": a save that removed or replaced a data file another model reads);
- a case that says what it expects gets it: "refused" (exit 2) or "works" (not exit 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.fuzz.case import Case, restore_permissions
from tools.fuzz.observe import (
    bad_json,
    broken_reads,
    external_reads,
    is_traceback,
    json_mode,
    raw_output,
    visible,
)

# Every command is expected to stay within this much address space on the harness's small
# models: a run that needs more is a memory blow-up (a declared size trusted, a huge
# broadcast) and dies with MemoryError or a signal, which the classifier reports.
ADDRESS_SPACE_LIMIT = 6 << 30
ERROR_LINE = re.compile(r"^dqtool: error: (.+)$")
OWN_LINE = re.compile(r"^dqtool: (error|warning): ")


@dataclass
class Outcome:
    verdict: str  # "clean" or the failure's class
    detail: str
    exit_code: int | None
    stderr: str
    seconds: float

    @property
    def clean(self) -> bool:
        return self.verdict == "clean"


# -- snapshots ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    kind: str  # "file", "dir", "symlink", "fifo", "socket", "chardev", "other"
    ino: int
    size: int
    mtime: int
    digest: str  # content hash of a regular file, link target of a symlink
    target_kind: str = ""  # for a symlink: the kind of what it points to ("" if dangling)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "chardev")):
        if test(mode):
            return name
    return "other"


def snapshot(root: Path) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            kind = _kind(st.st_mode)
            digest, target_kind = "", ""
            if kind == "file":
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for block in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(block)
                digest = h.hexdigest()
            elif kind == "symlink":
                digest = os.readlink(p)
                try:
                    target_kind = _kind(os.stat(p).st_mode)
                except OSError:
                    target_kind = ""
            entries[str(p.relative_to(root))] = Entry(
                kind, st.st_ino, st.st_size if kind == "file" else 0,
                st.st_mtime_ns if kind == "file" else 0, digest, target_kind)
    return entries


# -- what a command may touch -------------------------------------------------------------
WRITERS = ("fold", "upgrade", "downgrade", "pack", "qdq", "qoperator")
# Exit 1 of these means refused, nothing written (fold's exit 1 still writes; pack has none).
REFUSERS = ("upgrade", "downgrade", "qdq", "qoperator")


def _output_folder(argv: list[str]) -> str | None:
    """The folder (relative to the sandbox) the command may write in, or None."""
    if not argv or argv[0] not in WRITERS or "--dry-run" in argv:
        return None
    if "--in-place" in argv:
        return os.path.dirname(_model_arg(argv)) or "."
    for flag in ("-o", "--output"):
        if flag in argv:
            out = argv[argv.index(flag) + 1]
            return os.path.dirname(out.rstrip("/")) or "."
    return os.path.dirname(_model_arg(argv)) or "."


_VALUED = {"-o", "--output", "--opset", "--against", "--target", "--select", "--ignore",
           "--format", "--dtype", "--op-types", "--include", "--exclude", "--x-types",
           "--min-elements", "--shard-size", "--rtol", "--atol", "--seed", "--shape",
           "--inputs", "--accuracy-level", "--zero-points"}


def _model_arg(argv: list[str]) -> str:
    i = 1
    while i < len(argv):
        if argv[i] in _VALUED:
            i += 2
            continue
        if not argv[i].startswith("-"):
            return argv[i]
        i += 1
    return ""


def _file_args(argv: list[str]) -> set[str]:
    """The paths a one-line error may name: the model(s), --against, the output, as given
    or normalized (``out/dir/`` may be named ``out/dir``, an empty name ``.``)."""
    paths = [_model_arg(argv)]
    for flag in ("-o", "--output", "--against"):
        if flag in argv:
            paths.append(argv[argv.index(flag) + 1])
    if argv and argv[0] == "lint":
        paths += [a for a in argv[1:] if a.endswith(".onnx")]
    named = {p for p in paths} | {os.path.normpath(p) for p in paths}
    return named | {visible(p) for p in named}  # as dqtool shows a path it cannot print


def _under(rel: str, folder: str) -> bool:
    return (folder == "." and "/" not in rel) or rel.startswith(folder.rstrip("/") + "/")


def judge(case: Case, before: dict[str, Entry], after: dict[str, Entry], code: int | None,
          stderr: str, out_folder: str | None = None, *, stdout: bytes = b"",
          raw_stderr: bytes | None = None, root: Path | None = None,
          reads: dict | None = None) -> tuple[str, str]:
    """The verdict and its detail. ``out_folder``: the output's folder with symbolic links
    resolved (relative to the sandbox), when it differs from the one named. ``stdout`` and
    ``raw_stderr``: the bytes printed (``stderr`` is their text). ``reads``: what the
    models of the sandbox ``root`` read before the run (``observe.external_reads``)."""
    printed = _printed(case, code, stderr, stdout,
                       stderr.encode("utf-8", "surrogateescape") if raw_stderr is None
                       else raw_stderr)
    if printed is not None:
        return printed
    if case.expect == "refused" and code != 2:
        return "not-refused", f"exit {code}: the case must be refused (exit 2)"
    if case.expect == "works" and code == 2:
        return "refused-valid", visible(stderr.strip())[:300]
    changed = _changes(case.argv, before, after, code, out_folder)
    if changed is not None:
        return changed
    missing = _output_missing(case.argv, before, after, code, out_folder)
    if missing is not None:
        return "output-missing", missing
    if root is not None and reads:
        broken = broken_reads(root, reads)
        if broken is not None:
            return "other-model-broken", broken
    return "clean", ""


def _printed(case: Case, code: int | None, stderr: str, stdout: bytes,
             raw_stderr: bytes) -> tuple[str, str] | None:
    """The verdict on what the run printed and how it exited, or None if that is clean."""
    argv = case.argv
    lines = [line for line in stderr.splitlines() if line.strip()]
    if is_traceback(stderr):
        last = lines[-1] if lines else ""
        return "traceback", last[:300]
    if code not in (0, 1, 2):
        return "bad-exit", f"exit {code}: {lines[-1][:300] if lines else ''}"
    for stream, name in ((stdout, "stdout"), (raw_stderr, "stderr")):
        raw = raw_output(stream, name)
        if raw is not None:
            return "raw-control", raw
    if json_mode(argv) and (problem := bad_json(stdout)) is not None:
        return "bad-json", problem
    if code == 2:
        if len(lines) != 1:
            return "multi-line-error", " | ".join(lines)[:400]
        m = ERROR_LINE.match(lines[0])
        if not m:
            return "not-one-error-line", lines[0][:300]
        named = m.group(1)
        if not any(named.startswith(f"{p}: ") for p in _file_args(argv)):
            return "wrong-file", lines[0][:300]
    else:
        stray = [line for line in lines if not OWN_LINE.match(line)]
        if stray:
            return "stray-stderr", " | ".join(stray)[:400]
    return None


def _changes(argv: list[str], before: dict[str, Entry], after: dict[str, Entry],
             code: int | None, out_folder: str | None) -> tuple[str, str] | None:
    """The verdict on what the run created, changed or removed, or None if allowed."""
    out = out_folder if out_folder is not None else _output_folder(argv)
    model_folder = os.path.dirname(_model_arg(argv)) or "."
    in_place_ok = "--in-place" in argv and code in (0, 1)
    refused = code == 2 or (code == 1 and argv[0] in REFUSERS)
    for rel, old in before.items():
        new = after.get(rel)
        if new == old:
            continue
        if old.kind != "file" and not (old.kind == "symlink"
                                       and old.target_kind in ("file", "")):
            return "non-regular-replaced", f"{rel} ({old.kind}) became {new and new.kind}"
        what = f"{rel} changed" if new else f"{rel} removed"
        if _under(rel, model_folder) and not in_place_ok:
            return "input-modified", what
        if out is None or not _under(rel, out):
            return "outside-touched", what
        if refused:
            return "written-on-refusal", f"{what} (exit {code})"
    for rel in after:
        if rel in before:
            continue
        if out is None or not _under(rel, out):
            return "outside-touched", f"{rel} created"
        if refused:
            return "written-on-refusal", f"{rel} created (exit {code})"
        if os.path.basename(rel).startswith("."):
            return "leftover-temp", f"{rel} left behind"
    return None


def output_name(argv: list[str]) -> str | None:
    """The output a writer names (``-o``, or the model itself with ``--in-place``)."""
    if not argv or argv[0] not in WRITERS or "--dry-run" in argv:
        return None
    if "--in-place" in argv:
        return _model_arg(argv)
    for flag in ("-o", "--output"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            return argv[argv.index(flag) + 1]
    return None


def _output_missing(argv: list[str], before: dict[str, Entry], after: dict[str, Entry],
                    code: int | None, out_folder: str | None) -> str | None:
    """A writer that reports success (exit 0; fold's exit 1 writes too) must leave a file
    at the name it was given, not under another (a mangled name that is not UTF-8)."""
    name = output_name(argv)
    wrote = code == 0 or (code == 1 and argv[0] not in REFUSERS)
    if name is None or not wrote or name in ("", ".") or name.endswith("/"):
        return None
    folder = out_folder if out_folder is not None else os.path.dirname(name) or "."
    rel = os.path.normpath(os.path.join(folder, os.path.basename(name)))
    old = before.get(rel)
    if old is not None and old.kind == "dir":
        return None  # what a folder given as the output means is not the judge's to say
    new = after.get(rel)
    if new is None or not (new.kind == "file" or new.target_kind == "file"):
        return f"{visible(rel)} is {new.kind if new else 'not there'} after exit {code}"
    return None


# -- running -------------------------------------------------------------------------------
def _child(argv: list[str], cwd: Path, out_path: Path, err_path: Path) -> None:
    """In the forked child: a fresh ``dqtool`` run as a user would make it."""
    import io
    import logging
    import traceback
    import warnings

    code = 1
    try:
        os.chdir(cwd)
        os.setsid()
        fd_out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fd_err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        os.close(fd_out)
        os.close(fd_err)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        # As a fresh interpreter has them (a test runner's capture would hide output).
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.setLevel(logging.WARNING)
        logging.lastResort = logging._StderrHandler(logging.WARNING)
        warnings.resetwarnings()
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):
            warnings.simplefilter("ignore", category)
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
        sys.argv = ["dqtool", *argv]
        from dqtool.cli import main

        main(argv)
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def preload() -> None:
    """Import what every command imports, once, so that forked runs start at once."""
    import click

    import dqtool.cli
    from dqtool.cli import COMMANDS, LazyGroup, cli

    ctx = click.Context(cli)
    for name in COMMANDS:
        LazyGroup.get_command(cli, ctx, name)
    import dqtool.checking
    import dqtool.folding
    import dqtool.linting  # noqa: F401


def _wait(pid: int, timeout: float) -> tuple[int | None, int | None, bool]:
    """(exit code, signal, timed out)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return None, os.WTERMSIG(status), False
            return os.WEXITSTATUS(status), None, False
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, None, True
        time.sleep(0.005)


def run(case: Case, timeout: float = 30.0, fork: bool = True,
        keep: Path | None = None) -> Outcome:
    """Run ``case`` in a new sandbox and judge it. ``fork``: run ``dqtool`` in a child of
    this process (which has imported it already, see ``preload``) instead of a new
    interpreter — the same entry point and a fresh process, ten times faster."""
    base = Path(tempfile.mkdtemp(prefix="dqtool-fuzz-"))
    root = base / "box"
    try:
        case.materialize(root)
        before = snapshot(root)
        reads = external_reads(root, _skipped(root, case.argv))
        out_path, err_path = base / "stdout", base / "stderr"
        start = time.monotonic()
        if fork:
            pid = os.fork()
            if pid == 0:
                _child(case.argv, root, out_path, err_path)
            code, sig, hung = _wait(pid, timeout)
        else:
            code, sig, hung = _subprocess(case.argv, root, out_path, err_path, timeout)
        seconds = time.monotonic() - start
        raw_err = err_path.read_bytes() if err_path.exists() else b""
        stderr = raw_err.decode("utf-8", "replace")
        if hung:
            return Outcome("hang", f"no exit after {timeout:.0f} s", None, stderr, seconds)
        if sig is not None:
            return Outcome("signal", f"killed by {signal.Signals(sig).name}", None, stderr,
                           seconds)
        restore_permissions(root)
        verdict, detail = judge(case, before, snapshot(root), code, stderr,
                                _resolved(root, _output_folder(case.argv)),
                                stdout=out_path.read_bytes() if out_path.exists() else b"",
                                raw_stderr=raw_err, root=root, reads=reads)
        # The sandbox's random name out (one bug, one signature), then escaped: the report
        # must not do to the terminal what it caught dqtool doing.
        for name in {str(root), os.path.realpath(root)}:
            detail = detail.replace(name, "<sandbox>")
        return Outcome(verdict, visible(detail), code, stderr, seconds)
    finally:
        restore_permissions(base)
        if keep is not None:
            shutil.copytree(base, keep, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def _skipped(root: Path, argv: list[str]) -> set[str]:
    """The command's output, under every name the sandbox's walk may give it: it is the
    one model whose data may change."""
    name = output_name(argv)
    if name is None:
        return set()
    real = os.path.realpath(root / name)
    return {name, os.path.normpath(name), os.path.relpath(real, os.path.realpath(root))}


def _resolved(root: Path, folder: str | None) -> str | None:
    """A folder named through a symbolic link is the folder it points to (a user who gives
    ``-o link/out.onnx`` asks for a file there)."""
    if folder is None:
        return None
    real = os.path.realpath(root / folder)
    base = os.path.realpath(root)
    return os.path.relpath(real, base) if real.startswith(base + os.sep) or real == base \
        else folder


def _subprocess(argv: list[str], cwd: Path, out_path: Path, err_path: Path,
                timeout: float) -> tuple[int | None, int | None, bool]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        p = subprocess.Popen([sys.executable, "-m", "dqtool", *argv], cwd=cwd, stdout=fo,
                             stderr=fe, stdin=subprocess.DEVNULL, preexec_fn=limit,
                             start_new_session=True)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None, None, True
    if code < 0:
        return None, -code, False
    return code, None, False

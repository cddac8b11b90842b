"""Names, locations and paths holding control characters, bidi overrides, NUL and bytes that
are not UTF-8 reach the terminal only as visible escapes (``dqtool.printable``); every error
is one line; JSON output gives the names back exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from dqtool.printable import shown

PY = sys.executable
# A forged line, a carriage return, colour and title escape sequences, a bell, bidi
# overrides and isolates, a zero-width joiner, NUL.
HOSTILE = ("n\nTraceback (most recent call last):\rX\x1b[31mred\x1b]0;t\x07"
           "\u202eevil\u2066i\u2069\u200d\x00z")
LOCATION = "w\n\x1b[2J\u202e\r.bin"  # a file name may hold all but NUL and "/"


def _model(folder: Path, *, external: bool = False, name: str = HOSTILE) -> Path:
    """Y = X @ DequantizeLinear(W), every name hostile."""
    q = numpy_helper.from_array(np.arange(64, dtype=np.int8).reshape(8, 8) - 32, f"{name}q")
    s = numpy_helper.from_array(np.full(8, 0.5, np.float32), f"{name}s")
    dq = helper.make_node("DequantizeLinear", [q.name, s.name], [f"{name}w"], axis=1,
                          name=f"{name}dq")
    mm = helper.make_node("MatMul", [f"{name}x", f"{name}w"], [f"{name}y"], name=f"{name}mm")
    g = helper.make_graph(
        [dq, mm], f"{name}g",
        [helper.make_tensor_value_info(f"{name}x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(f"{name}y", onnx.TensorProto.FLOAT, [1, 8])], [q, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path = folder / "m.onnx"
    if external:
        onnx.save(m, path, save_as_external_data=True, location=LOCATION,
                  size_threshold=0)
    else:
        onnx.save(m, path)
    return path


def _run(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # Wide: a table would fold a long name across lines.
    return subprocess.run([PY, "-m", "dqtool", *args], capture_output=True, cwd=cwd,
                          timeout=300, env={**os.environ, "COLUMNS": "4000"})


def _assert_visible(stream: bytes, what: str) -> str:
    """Valid UTF-8, no character but the newline that ``str.isprintable`` refuses, and no
    line that starts as a traceback does."""
    text = stream.decode("utf-8")  # strict: no raw byte that is not UTF-8
    bad = {c for c in text if not c.isprintable() and c != "\n"}
    assert not bad, f"{what}: {[unicodedata.name(c, hex(ord(c))) for c in bad]}"
    assert not any(line.startswith("Traceback") for line in text.splitlines()), what
    return text


def _strings(doc: object) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def _assert_one_error_line(res: subprocess.CompletedProcess, what: str) -> str:
    assert res.returncode == 2, (what, res.returncode, res.stderr)
    err = _assert_visible(res.stderr, what)
    assert err.count("\n") == 1 and err.startswith("dqtool: error: "), (what, err)
    return err


def test_shown_escapes_what_a_terminal_would_obey():
    assert shown("plain name/with spaces é 名") == "plain name/with spaces é 名"
    assert shown("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert shown("\x1b[31m\x07\x00\x7f\x9b") == "\\x1b[31m\\x07\\x00\\x7f\\x9b"
    assert shown("\u202eabc\u2066\u200d\u2028") == "\\u202eabc\\u2066\\u200d\\u2028"
    assert shown(os.fsdecode(b"m\xff\xfe.onnx")) == "m\\xff\\xfe.onnx"
    assert shown(b"m\xffz") == "m\\xffz"
    assert shown("\U000e0001") == "\\U000e0001"  # a tag character (format)


@pytest.mark.parametrize("command", [
    ["inspect"], ["inspect", "--json"], ["lint"], ["lint", "--json"],
    ["lint", "--format", "github"], ["lint", "--format", "sarif"], ["check"],
    ["check", "--json"], ["fold", "-o", "out.onnx"], ["upgrade", "--opset", "23", "-o", "u.onnx"],
    ["downgrade", "--opset", "13", "-o", "d.onnx"]], ids=" ".join)
def test_hostile_names_are_shown_escaped(tmp_path, command):
    model = _model(tmp_path)
    res = _run(command[0], str(model), *command[1:], cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr
    out = _assert_visible(res.stdout, "stdout")
    _assert_visible(res.stderr, "stderr")
    if "--json" in command or "sarif" in command:
        strings = set(_strings(json.loads(out)))
        if command[0] in ("inspect", "check"):
            assert f"{HOSTILE}dq" in strings  # exactly, not escaped twice
    elif command[0] in ("inspect", "check"):
        assert shown(f"{HOSTILE}dq") in out  # the name, visibly escaped
    if command[0] in ("fold", "upgrade", "downgrade"):
        names = {n.name for n in onnx.load(tmp_path / command[-1]).graph.node}
        assert names and all(n.startswith(HOSTILE) for n in names)  # kept as they were


@pytest.mark.parametrize("command", [["inspect"], ["check"], ["fold", "-o", "o.onnx"],
                                     ["upgrade", "--opset", "23", "-o", "o.onnx"],
                                     ["lint"]], ids=" ".join)
def test_an_error_naming_a_hostile_location_is_one_line(tmp_path, command):
    model = _model(tmp_path, external=True)
    (tmp_path / LOCATION).unlink()  # the error names the missing data file
    res = _run(command[0], str(model), *command[1:], cwd=tmp_path)
    if command[0] == "lint" and res.returncode == 1:
        _assert_visible(res.stdout, "lint")  # a finding, not an error
        return
    err = _assert_one_error_line(res, " ".join(command))
    assert shown(LOCATION) in err


@pytest.mark.parametrize("command", [["inspect"], ["lint"], ["check"],
                                     ["fold", "-o", "o.onnx"]], ids=" ".join)
def test_a_missing_model_with_a_hostile_path_is_one_line(tmp_path, command):
    path = os.fsencode(tmp_path) + b"/m\xff\n\x1b[2J" + "\u202e".encode() + b".onnx"
    res = _run(command[0], path, *command[1:], cwd=tmp_path)
    err = _assert_one_error_line(res, " ".join(command))
    assert "m\\xff\\n\\x1b[2J\\u202e.onnx" in err


@pytest.mark.parametrize("command", [["fold"], ["upgrade", "--opset", "23"]], ids=" ".join)
def test_an_output_path_that_is_not_utf8_is_shown_escaped(tmp_path, command):
    model = _model(tmp_path, name="plain")
    out = os.fsencode(tmp_path) + b"/o\xff\x1b.onnx"
    res = _run(command[0], str(model), *command[1:], "-o", out, cwd=tmp_path)
    if res.returncode == 2:  # refused, in one line
        err = _assert_one_error_line(res, "refused")
        assert "o\\xff\\x1b.onnx" in err
        assert not os.path.exists(out)
    else:
        assert res.returncode == 0, res.stderr
        text = _assert_visible(res.stdout, "stdout")
        assert "o\\xff\\x1b.onnx" in text
        assert onnx.load(os.fsdecode(out)).graph.node

"""One-line messages from exceptions raised by runtimes and libraries."""

from __future__ import annotations


def one_line(e: BaseException, limit: int = 400) -> str:
    """The message on one line, without onnxruntime's C++ source location and function
    signature (``/onnxruntime_src/....h:46 void f(const std::...&) Real message``)."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    src = text.find("/onnxruntime_src/")
    if src >= 0:
        depth, i = 0, text.find("(", src)
        while 0 <= i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        if 0 <= i < len(text):
            text = text[:src] + text[i + 1:].lstrip()
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."

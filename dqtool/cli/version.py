"""``dqtool --version``: the versions of dqtool and of the packages whose behaviour it
depends on, read from the installed distributions' metadata.

Importing onnxruntime to ask its version costs about a second; its metadata costs
milliseconds and names the same release, so versions are read from metadata. The last line,
the CPU code path onnxruntime takes here, is a behaviour: it imports onnxruntime and runs
one one-node session (``dqtool.runtimes.cpu_path``).
"""

from __future__ import annotations

import platform
from importlib import metadata

# package -> distributions that provide it, the usual one first
PACKAGES: dict[str, tuple[str, ...]] = {
    "onnx": ("onnx",),
    "onnx_ir": ("onnx-ir",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml",
                    "onnxruntime-openvino", "onnxruntime-qnn", "ort-nightly"),
    "numpy": ("numpy",),
}


def installed(dists: tuple[str, ...]) -> tuple[str, str] | None:
    """(distribution, version) of the first of ``dists`` that is installed."""
    for dist in dists:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, tuple[str | None, str | None]]:
    """Package name -> (distribution, version) in use; (None, None) when not installed."""
    from dqtool import __version__

    found: dict[str, tuple[str | None, str | None]] = {"dqtool": ("dqtool", __version__)}
    for package, dists in PACKAGES.items():
        found[package] = installed(dists) or (None, None)
    found["python"] = (None, platform.python_version())
    return found


def text() -> str:
    """What ``dqtool --version`` prints: one ``name version`` line per package, naming the
    distribution when it is not the usual one (``onnxruntime 1.32.0 (onnxruntime-gpu)``)."""
    lines = []
    for package, (dist, version) in versions().items():
        usual = PACKAGES.get(package, (dist,))[0]
        note = f" ({dist})" if dist is not None and dist != usual else ""
        lines.append(f"{package} {version or 'not installed'}{note}")
    # (``from dqtool import native`` would ask dqtool's lazy ``__getattr__`` first, which
    # loads every family to look for the name)
    from dqtool.native import status

    lines.append(f"native transpose {status()}")
    # The one import of onnxruntime here: which CPU code path it takes is a behaviour, not
    # metadata (one one-node session; docs/semantics.md "CPU code paths").
    from dqtool.runtimes import cpu_path

    p = cpu_path.probe()
    lines.append(f"cpu {p.name}: {p.describe()}")
    return "\n".join(lines)

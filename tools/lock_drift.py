"""Print how the installed packages differ from a lock file (``make test-latest``,
``make test-ort``): the test run that follows is then read against that list.

Usage: python tools/lock_drift.py requirements.lock
Exit code 0 always: drift is a report, the tests are the verdict.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            pins[_norm(m[1])] = m[2]
    return pins


def installed() -> dict[str, str]:
    return {_norm(d.metadata["Name"]): d.version for d in metadata.distributions()
            if d.metadata["Name"]}


def drift(lock: dict[str, str], have: dict[str, str]) -> list[str]:
    """One line per locked package installed at another version. Locked packages that are
    not installed (the build tools, where pip built dqtool in isolation) are not drift."""
    return [f"  {name}: locked {lock[name]}, installed {have[name]}"
            for name in sorted(lock) if name in have and have[name] != lock[name]]


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "requirements.lock")
    lock, have = locked(path), installed()
    lines = drift(lock, have)
    absent = sorted(set(lock) - set(have))
    if lines:
        print(f"drift: {len(lines)} package(s) differ from {path}:")
        print("\n".join(lines))
    else:
        print(f"drift: none (every installed package of {path} is at its locked version)")
    if absent:
        print(f"  (not installed here: {', '.join(absent)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

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
    lines = []
    for name in sorted(lock):
        got = have.get(name)
        if got is None:
            lines.append(f"  {name}: locked {lock[name]}, not installed")
        elif got != lock[name]:
            lines.append(f"  {name}: locked {lock[name]}, installed {got}")
    return lines


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "requirements.lock")
    lines = drift(locked(path), installed())
    if lines:
        print(f"drift: {len(lines)} package(s) differ from {path}:")
        print("\n".join(lines))
    else:
        print(f"drift: none (every package of {path} is installed at its locked version)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

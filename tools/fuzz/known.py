"""Failures the harness finds but that are being fixed elsewhere, named so they are neither
hidden nor allowed to turn the test suite red. Each entry is (family, kind prefix, verdict):
a run matching one is reported as "known", not as a finding. Clear an entry once the fix
is on main (the harness lists the entries no run of a campaign matched: they may pass)."""

from __future__ import annotations

# An entry reads, e.g.:
#   ("output", "fifo", "non-regular-replaced"): "being fixed in the save path (branch X)",
KNOWN: dict[tuple[str, str, str], str] = {}

SEEN: set[tuple[str, str, str]] = set()  # entries some run of this process matched


def known(family: str, kind: str, verdict: str) -> str | None:
    for (fam, prefix, v), why in KNOWN.items():
        if fam == family and kind.startswith(prefix) and v == verdict:
            SEEN.add((fam, prefix, v))
            return why
    return None

"""``python -m tools.fuzz [--seconds N] [--seed S] [--save DIR] [--subprocess]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.fuzz.campaign import FAMILIES, Campaign
from tools.fuzz.known import KNOWN, SEEN
from tools.fuzz.run import preload

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", type=Path, default=REPO / "tests" / "fuzz_regressions",
                   help="where failing inputs are saved as reproducers")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a run hangs")
    p.add_argument("--subprocess", action="store_true",
                   help="run each command in a new interpreter (slower; default forks)")
    p.add_argument("--families", default=",".join(FAMILIES))
    args = p.parse_args(argv)
    if not args.subprocess:
        preload()
    campaign = Campaign(args.seconds, args.seed, None if args.no_save else args.save,
                        timeout=args.timeout, fork=not args.subprocess,
                        families=tuple(args.families.split(",")))
    r = campaign.go()
    print(f"fuzz: seed {args.seed}: {r.runs} runs in {r.seconds:.0f} s "
          f"({', '.join(f'{k} {v}' for k, v in sorted(r.by_family.items()))}); "
          f"verdicts: {dict(sorted(r.by_verdict.items()))}")
    for what, n in sorted(r.known.items()):
        print(f"  known ({n}×): {what}")
    for entry in sorted(set(KNOWN) - SEEN):
        print(f"  known entry not seen in this campaign (does it pass now?): {entry}")
    for case, outcome in r.findings:
        print(f"  FINDING {outcome.verdict}: {case.label}: {outcome.detail}")
    for folder in r.saved:
        print(f"  saved {folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder}")
    print(f"findings: {len(r.findings)}")
    return 1 if r.findings else 0


if __name__ == "__main__":
    sys.exit(main())

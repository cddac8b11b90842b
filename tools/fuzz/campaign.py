"""A fuzz campaign: every family in turn until the time budget is spent."""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from tools.fuzz import (
    hostile_attributes,
    hostile_data,
    hostile_names,
    hostile_outputs,
    hostile_paths,
    mutate_bytes,
    mutate_structure,
    shared_data,
)
from tools.fuzz.case import Case
from tools.fuzz.known import known
from tools.fuzz.run import Outcome, run

# The last four: the kinds of the hostile campaign of 2026-11 (docs/safety.md).
FAMILIES = ("bytes", "structure", "external", "output", "paths", "names", "fused", "shared")


@dataclass
class Result:
    runs: int = 0
    seconds: float = 0.0
    by_family: Counter = field(default_factory=Counter)
    by_verdict: Counter = field(default_factory=Counter)
    known: Counter = field(default_factory=Counter)
    findings: list[tuple[Case, Outcome]] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)


def signature(case: Case, outcome: Outcome) -> str:
    """What makes two failures the same bug, roughly: the verdict, the command, the
    mutation and the last line of the error without numbers."""
    detail = "".join(c for c in outcome.detail if not c.isdigit())[:120]
    kind = case.kind.split("@")[0].split(":")[0]
    if outcome.verdict == "raw-control":  # the line quoted varies with the name: not it
        detail = f"{case.argv[0]} {outcome.detail.split(' line ')[0]}"
    return f"{outcome.verdict}|{case.family}|{kind}|{detail}"


def _folder_name(case: Case) -> str:
    h = hashlib.sha256(repr((case.argv, sorted(case.files.items()),
                             case.special)).encode()).hexdigest()[:10]
    kind = "".join(c if c.isalnum() or c in "-+" else "-" for c in case.kind.split("@")[0])
    return f"{case.family}-{kind[:40]}-{case.argv[0]}-{h}"


class Campaign:
    def __init__(self, seconds: float, seed_value: int, save_to: Path | None,
                 timeout: float = 30.0, fork: bool = True,
                 families: tuple[str, ...] = FAMILIES, log=print) -> None:
        self.deadline = time.monotonic() + seconds
        if seconds >= 600:
            mutate_structure.CHAIN_LENGTHS[:] = mutate_structure.LONG_CHAIN_LENGTHS
        self.seed = seed_value
        self.rng = random.Random(seed_value)
        self.save_to = save_to
        self.timeout, self.fork = timeout, fork
        self.families = families
        self.log = log
        self.result = Result()
        self.seen: set[str] = set()
        self._streams = {
            "bytes": mutate_bytes.cases(random.Random(seed_value * 4 + 0)),
            "external": hostile_data.cases(random.Random(seed_value * 4 + 1)),
            "output": hostile_outputs.cases(random.Random(seed_value * 4 + 2)),
            # Seeds of their own (the first three keep theirs: old seeds replay as before).
            "paths": hostile_paths.cases(random.Random(seed_value * 8 + 104)),
            "names": hostile_names.cases(random.Random(seed_value * 8 + 105)),
            "fused": hostile_attributes.cases(random.Random(seed_value * 8 + 106)),
            "shared": shared_data.cases(random.Random(seed_value * 8 + 107)),
        }
        self._chunk = 0
        self.shrink_runs = 40  # runs hypothesis may spend shrinking one failure

    def time_left(self) -> bool:
        return time.monotonic() < self.deadline

    def record(self, case: Case, outcome: Outcome) -> bool:
        """Count a run; True if it is a (new or known) failure."""
        r = self.result
        r.runs += 1
        r.seconds += outcome.seconds
        r.by_family[case.family] += 1
        r.by_verdict[outcome.verdict] += 1
        if outcome.clean:
            return False
        why = known(case.family, case.kind, outcome.verdict)
        if why is not None:
            r.known[f"{case.family}:{case.kind.split(':')[0]} {outcome.verdict} ({why})"] += 1
            return False
        return True

    def _save(self, case: Case, outcome: Outcome) -> None:
        sig = signature(case, outcome)
        if sig in self.seen:
            return
        self.seen.add(sig)
        self.result.findings.append((case, outcome))
        self.log(f"FAIL {outcome.verdict}: {case.label}: {outcome.detail}")
        if self.save_to is not None:
            folder = self.save_to / _folder_name(case)
            case.save(folder, f"{outcome.verdict}: {outcome.detail}")
            self.result.saved.append(folder)

    def _one(self, case: Case) -> None:
        outcome = run(case, self.timeout, self.fork)
        if not self.record(case, outcome):
            return
        if case.family == "bytes":
            def same(c: Case) -> bool:
                return run(c, self.timeout, self.fork).verdict == outcome.verdict
            case = mutate_bytes.shrink(case, same)
        self._save(case, outcome)

    def _structure_chunk(self, examples: int = 8) -> None:
        """A few hypothesis examples; hypothesis shrinks a failure before it is saved."""
        failing: list[tuple[Case, Outcome]] = []
        campaign = self

        @seed(self.seed * 7919 + self._chunk)
        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck),
                  phases=[Phase.generate, Phase.shrink], print_blob=False,
                  report_multiple_bugs=False)
        @given(mutate_structure.cases())
        def probe(case: Case) -> None:
            if not campaign.time_left() or len(failing) > campaign.shrink_runs:
                return  # out of time, or shrunk enough: the last failure is kept
            outcome = run(case, campaign.timeout, campaign.fork)
            if not failing:  # count the generated runs, not the shrinking replays
                new = campaign.record(case, outcome)
            else:
                new = not outcome.clean and known(case.family, case.kind,
                                                  outcome.verdict) is None
            if new:
                failing.append((case, outcome))
                raise AssertionError(outcome.verdict)
            if failing:
                failing.append(failing[-1])  # a shrinking step that passed counts too

        self._chunk += 1
        try:
            probe()
        except AssertionError:
            pass
        except Exception as e:  # hypothesis' own complaints: report, keep going
            self.log(f"hypothesis: {type(e).__name__}: {e}")
        if failing:
            self._save(*failing[-1])  # the last failing example is the shrunk one

    def go(self) -> Result:
        start = time.monotonic()
        i = 0
        while self.time_left():
            family = self.families[i % len(self.families)]
            i += 1
            if family == "structure":
                self._structure_chunk()
            else:
                self._one(next(self._streams[family]))
        self.result.seconds = time.monotonic() - start
        return self.result

"""Lint's per-node verdicts on a deployment target held to a runtime's own (``oracles``):
what the oracle tests count and the docs report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dqtool import storage
from dqtool.linting.context import ModelContext
from dqtool.linting.targets import deploy, parse


@dataclass
class Tally:
    agree: int = 0
    compared: int = 0
    disagreements: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # the runtime gave no verdict
    family_size: int = 0  # variants in the generated family run (over_family)

    def add(self, label: str, lint: object, runtime: object) -> None:
        self.compared += 1
        if lint == runtime:
            self.agree += 1
        else:
            self.disagreements.append(f"{label}: lint {lint}, runtime {runtime}")


def lint_verdicts(path: Path, target: str) -> tuple[list[deploy.Verdict], bool]:
    """The units lint judges, and whether lint says the runtime refuses the model."""
    profile = parse(target)
    verdicts = deploy.placement(ModelContext(str(path), storage.load(path)), profile)
    refusals = getattr(profile, "refusals", frozenset())
    return verdicts, any(i.code in refusals for v in verdicts for i in v.issues)


def compare(path: Path, target: str, oracle, tally: Tally) -> None:
    """Per unit: quantized or not, as lint and the runtime say. A model the runtime refuses
    (OpenVINO) is one comparison: lint must find a refusal in it too."""
    verdicts, lint_refuses = lint_verdicts(path, target)
    if not verdicts:
        return
    if target.startswith("qnn"):
        runtime = oracle.verdicts(path)
    else:
        nodes = [(v.unit.name, v.unit.op_type, [o.name for o in v.unit.site.node.outputs])
                 for v in verdicts]
        try:
            runtime = oracle.verdicts(path, nodes)
        except Exception:  # refused when read or compiled
            tally.add(f"{path.name} (model)", "refused" if lint_refuses else "loads",
                      "refused")
            return
        if lint_refuses:
            tally.add(f"{path.name} (model)", "refused", "loads")
            return
    for v in verdicts:
        said = runtime.get(v.unit.name)
        label = f"{path.name}:{v.unit.name} ({v.unit.op_type})"
        if said is None:
            tally.not_compared.append(label)
        else:
            tally.add(label, v.quantized, said[0])


def over_family(target: str, oracle, tmp_path, save, dm) -> Tally:
    """Lint's verdict against ``oracle``'s over the generated QDQ family (``DQTOOL_SLOW=1``:
    the large one); each disagreement names the variant."""
    import os

    size = "large" if os.environ.get("DQTOOL_SLOW") else "small"
    tally = Tally()
    for i, v in enumerate(dm.family(size)):
        path = save(dm.model(v), tmp_path / f"v{i}.onnx")
        before = len(tally.disagreements)
        compare(path, target, oracle, tally)
        tally.disagreements[before:] = [f"{d} [{v.label}]" for d in tally.disagreements[before:]]
    tally.family_size = len(dm.family(size))
    return tally

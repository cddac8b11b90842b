"""What a check found, as data: JSON-able, and re-judgeable with other tolerances."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dqtool.checking.against import RuntimeComparison
from dqtool.checking.inputs import DEFAULT_DIM
from dqtool.checking.runners import Runtime
from dqtool.checking.selfcheck import NodeCheck, Structure


@dataclass(frozen=True)
class CheckReport:
    input: str  # the checked model (its path, or a name for a model object)
    against: str | None
    runtimes: tuple[Runtime, ...]
    seed: int
    rtol: float
    atol: float
    inputs: dict[str, dict[str, Any]]  # name -> {"shape", "dtype", "source"}
    defaulted_dims: tuple[str, ...]  # dimensions that took DEFAULT_DIM
    structure: Structure | None = None  # of the checked model
    nodes: tuple[NodeCheck, ...] = ()  # check alone
    comparisons: tuple[RuntimeComparison, ...] = ()  # --against
    notes: tuple[str, ...] = field(default=())
    weights: tuple = ()  # --against: fused weights of the original, compared bit for bit
    # --against: the original's fused nodes on onnxruntime in both models, each against its
    # summation-order bound (computed when an onnxruntime output is beyond rtol/atol)
    bounds: tuple = ()
    # --against: each rewritten node alone on the original's inputs (reported, not judged)
    per_op: tuple = ()
    # --against, for a conversion onnxruntime fuses back: the checked model with every
    # optimization against the original ({"identical", "mismatched", "error"}); reported
    # (JSON key "fused": onnxruntime's graph fusions)
    optimized_run: dict[str, Any] | None = None

    @property
    def mode(self) -> str:
        return "against" if self.against is not None else "self"

    @property
    def passed(self) -> bool:
        structure = self.structure is None or self.structure.passed
        if self.against is not None:
            return structure and self.compared and all(
                c.passed for c in self.comparisons if c.judged) and all(
                w.passed for w in self.weights)
        return structure and all(n.passed for n in self.nodes)

    @property
    def compared(self) -> bool:
        """With --against: at least one judged runtime ran both models."""
        return any(c.skipped is None for c in self.comparisons if c.judged)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def judge(self, rtol: float, atol: float) -> CheckReport:
        """The same statistics under other tolerances (per-node checks stay bit-exact)."""
        return replace(self, rtol=rtol, atol=atol,
                       comparisons=tuple(c.judge(rtol, atol) for c in self.comparisons))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "input": self.input, "against": self.against, "mode": self.mode,
            "passed": self.passed,
            "runtimes": [r.to_json() for r in self.runtimes],
            "tolerance": {"rtol": self.rtol, "atol": self.atol,
                          "criterion": "max abs error <= atol or max rel error <= rtol; "
                          "a NaN in one output and not the other fails"},
            "seed": self.seed, "inputs": self.inputs,
            "default_dim": DEFAULT_DIM, "defaulted_dims": list(self.defaulted_dims),
            "notes": list(self.notes),
        }
        doc["structure"] = None if self.structure is None else self.structure.to_json()
        if self.against is None:
            doc["nodes"] = [n.to_json() for n in self.nodes]
            doc["summary"] = {s: sum(n.status == s for n in self.nodes)
                              for s in ("bit-exact", "within-tolerance",
                                        "runtime-deviation", "mismatch", "kernel-only",
                                        "skipped", "error")}
            # --runtime: the model on a deployment runtime against the reference evaluator
            doc["comparisons"] = [c.to_json() for c in self.comparisons]
        else:
            doc["comparisons"] = [c.to_json() for c in self.comparisons]
            doc["weights"] = [w.to_json() for w in self.weights]
            doc["bounds"] = [b.to_json() for b in self.bounds]
            doc["per_op"] = [e.to_json() for e in self.per_op]
            doc["fused"] = self.optimized_run
        return doc

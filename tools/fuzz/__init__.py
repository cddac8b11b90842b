"""A fuzz harness for dqtool's commands: hostile models, external data and outputs.

``python -m tools.fuzz --seconds 60 --seed 1`` (``make fuzz``) runs every command on
generated inputs, classifies each run (see ``run.classify``) and saves every failing input
as a minimal reproducer under ``tests/fuzz_regressions/``, which the test suite replays.
Details: ``docs/safety.md``.
"""

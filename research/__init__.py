"""Probes behind the figures in docs/tried.md and docs/speed.md: one-off measurements, not
part of the library or of the project.yml workflows. Run from the repository root as
modules, e.g. `python -m research.quantize_eval PIPELINE --corpus conll03 --data ...`."""

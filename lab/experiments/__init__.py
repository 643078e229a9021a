"""One-off GPU experiments (see README.md); run from the repo root as ``python -m lab.experiments.<name>``."""

"""The lab: GPU probes, offline kernel inspection and one-off experiments behind the kernels' design decisions.

Not part of the installed package (``pyproject.toml`` installs ``attn_zoo``, ``kernels`` and ``eval``); run from
the repo root, e.g. ``python -m lab.probe_flash --out DIR``, ``python -m lab.inspect_kernels``,
``python -m lab.experiments.diag``. What users run (sweeps, crossovers, plots, quality, benchmarks) is in ``eval``.
"""

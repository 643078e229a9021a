"""Benchmarks, sweeps, crossover analysis, figures and reports of attn-zoo (run as ``python -m eval.<module>``)."""

from harness.errors import config_errors  # noqa: F401 - the Hydra apps' checks: a bad value's message alone


def hydra_cli(config_name: str, entry, prog=None) -> None:
    """The command line of a Hydra-configured ``eval`` module: ``eval/conf/<config_name>.yaml`` composed with the
    command's overrides, resolved, and passed to ``entry`` as a dict (Hydra's job name, output folder and log file are
    those of ``entry``'s module). ``prog``: a ``ValueError`` (bad arguments, nothing matching) prints
    ``<prog>: error: <message>`` and exits with status 2 instead of a traceback."""
    import functools
    import sys

    import hydra
    from omegaconf import OmegaConf

    @hydra.main(config_path="conf", config_name=config_name, version_base="1.3")
    @functools.wraps(entry)  # Hydra unwraps it: the config path and the job name are the entry module's
    def main(cfg):
        try:
            entry(OmegaConf.to_container(cfg, resolve=True))
        except ValueError as e:
            if prog is None:
                raise
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(2)

    main()

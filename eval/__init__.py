"""Benchmarks, sweeps, crossover analysis, figures and reports of attn-zoo (run as ``python -m eval.<module>``)."""

import contextlib


@contextlib.contextmanager
def config_errors():
    """Inside, a ``ValueError`` / ``FileNotFoundError`` (a bad value of a Hydra ``eval`` app's config, a path it
    names that is not there) is raised again as :class:`harness.config.ConfigError` / ``ConfigFileError`` with the
    same message, which Hydra prints alone (exit status 1), not after a traceback. The Hydra apps wrap their checks
    before any work in it. ``harness.config`` is imported only when an error is raised (it imports Lightning)."""
    try:
        yield
    except (ValueError, FileNotFoundError) as e:
        from harness.config import ConfigError, ConfigFileError

        if isinstance(e, (ConfigError, ConfigFileError)):
            raise
        if isinstance(e, FileNotFoundError):
            raise ConfigFileError(str(e)) from None
        raise ConfigError(str(e)) from None


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

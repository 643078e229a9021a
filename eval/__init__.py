"""Benchmarks, sweeps, crossover analysis, figures and reports of attn-zoo (run as ``python -m eval.<module>``)."""

from harness.errors import config_errors  # noqa: F401 - the Hydra apps' checks: a bad value's message alone


def hydra_cli(config_name: str, entry, prog=None, check_overrides=None) -> None:
    """The command line of a Hydra-configured ``eval`` module: ``eval/conf/<config_name>.yaml`` composed with the
    command's overrides, resolved, and passed to ``entry`` as a dict (Hydra's job name, output folder and log file are
    those of ``entry``'s module). ``prog``: a ``ValueError`` (bad arguments, nothing matching) prints
    ``<prog>: error: <message>`` and exits with status 2 instead of a traceback. ``check_overrides(cfg, overrides)``:
    raises ``ValueError`` for overrides of the command line (``key=value`` strings as given) that the composed
    ``cfg`` would ignore, before ``entry`` runs."""
    import functools
    import sys

    import hydra
    from omegaconf import OmegaConf

    @hydra.main(config_path="conf", config_name=config_name, version_base="1.3")
    @functools.wraps(entry)  # Hydra unwraps it: the config path and the job name are the entry module's
    def main(cfg):
        try:
            with config_errors():  # +foo=1 / +seq_len=[32] (a typo) was ignored and the default run made
                check_top_level_keys(config_name, cfg)
            plain = OmegaConf.to_container(cfg, resolve=True)
            if check_overrides is not None:
                from hydra.core.hydra_config import HydraConfig

                with config_errors():
                    check_overrides(plain, list(HydraConfig.get().overrides.task))
            entry(plain)
        except ValueError as e:
            if prog is None:
                raise
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(2)

    main()


def top_level_keys(config_name: str) -> list:
    """The top-level keys of ``eval/conf/<config_name>.yaml``: its own (but ``defaults``) and the groups its
    ``defaults`` list names (``sweep``), in the file's order."""
    from pathlib import Path

    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(Path(__file__).parent / "conf" / f"{config_name}.yaml"))
    groups = [next(iter(d)) for d in spec.get("defaults") or [] if isinstance(d, dict)]
    return [k for k in spec if k not in ("defaults", "hydra")] + groups


def check_top_level_keys(config_name: str, cfg) -> None:
    """Every top-level key of the composed ``cfg`` is one of :func:`top_level_keys` (what the ``eval`` module reads);
    else ``ValueError`` naming the key, the closest known key and all of them."""
    from harness.config import check_known_keys

    check_known_keys(cfg, top_level_keys(config_name), f"eval.{config_name}", "top-level keys",
                     " (a group's key is set under it, e.g. sweep.seq_lens=[64,128])")

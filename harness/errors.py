"""The errors of a bad config, which Hydra prints as their message alone (no traceback): :class:`ConfigError`,
:class:`ConfigFileError`, :class:`ConfigImportError` and :func:`config_errors`. Imports Hydra only (not Lightning or
torch), so ``train.py``'s checks (:mod:`harness.config`) and the ``eval`` apps share them at no import cost."""

from __future__ import annotations

import contextlib
from typing import Iterator

try:
    from hydra.errors import CompactHydraException

    _COMPACT = (CompactHydraException,)
except ImportError:  # harness.config without Hydra (eval.bench_model): only how Hydra prints the errors changes
    _COMPACT = ()


class ConfigError(*_COMPACT, ValueError):
    """A config value a run cannot start with (:func:`config_errors`). A ``ValueError``; Hydra prints its message
    alone, without the traceback of a fault in the code (``HYDRA_FULL_ERROR=1`` shows it)."""


class ConfigFileError(*_COMPACT, FileNotFoundError):
    """A file the config names that is not there (:func:`config_errors`); a ``FileNotFoundError``, printed as
    :class:`ConfigError`."""


class ConfigImportError(*_COMPACT, ImportError):
    """A module the config names (``plugins=[...]``) that cannot be imported (:func:`layer_specs`); an
    ``ImportError``, printed as :class:`ConfigError`."""


class ConfigConnectionError(*_COMPACT, ConnectionError):
    """A service the config names that cannot be reached (``data.hub_name``: the Hugging Face Hub offline); a
    ``ConnectionError``, printed as :class:`ConfigError`."""


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Inside, a ``ValueError`` / ``FileNotFoundError`` (the checks of a run's config, its data paths, its checkpoint)
    is raised again as :class:`ConfigError` / :class:`ConfigFileError` with the same message (a plugin that cannot be
    imported is a :class:`ConfigImportError` already), so that ``python
    train.py <bad value>`` prints the message naming the key and what to pass, not a traceback first. ``train.py``
    wraps its checks before training in it, nothing after training starts."""
    try:
        yield
    except (ConfigError, ConfigFileError, ConfigImportError, ConfigConnectionError):
        raise
    except FileNotFoundError as e:
        raise ConfigFileError(str(e)) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None

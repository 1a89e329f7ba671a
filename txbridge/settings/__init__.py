"""What every command line of txbridge shares, and the one place each resolves its settings.

:mod:`.options` declares the options (``--bootstrap``, ``--command-config``, ``-X``) and prints
errors as one line; :mod:`.bootstrap` resolves the bootstrap servers from their sources in the
documented order (docs/cli.md). Every layer with commands uses these; none imports the
``cli`` package that assembles the ``txbridge`` command.
"""

from txbridge.settings.bootstrap import LocalBroker, LocalBrokerFallback, resolve_bootstrap
from txbridge.settings.options import (
    BOOTSTRAP_ENV,
    bootstrap_option,
    client_config_flags,
    client_options,
    load_client_config,
    one_line_errors,
)

__all__ = [
    "BOOTSTRAP_ENV",
    "LocalBroker",
    "LocalBrokerFallback",
    "bootstrap_option",
    "client_config_flags",
    "client_options",
    "load_client_config",
    "one_line_errors",
    "resolve_bootstrap",
]

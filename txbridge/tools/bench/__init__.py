"""The benchmark behind ``txbridge bench`` (the command: :mod:`txbridge.tools.cli.bench`)."""

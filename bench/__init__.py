"""The benchmark behind ``txbridge bench`` (the command: :mod:`bench.cli`)."""

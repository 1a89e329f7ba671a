"""Tooling around the SDK: the ``txbridge`` command, the local servers and the benchmark.

Nothing in the SDK (the rest of :mod:`txbridge`) or in :mod:`coordinator` imports from here
(``lint-imports``, the contracts in pyproject.toml).
"""

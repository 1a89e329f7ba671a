"""The ``txbridge`` command: the main group (:mod:`.main`), one module per subcommand, and the
options they share (:mod:`.options`)."""

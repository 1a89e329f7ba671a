"""Back-checks: which open transactions are asked about (:mod:`.backchecks`), the signed HTTP
requests on their own threads (:mod:`.checker`, :mod:`.http_deadline`), the producer registry
(:mod:`.registry`), the brokers' clock read from it (:mod:`.broker_clock`), and expired
transactions resumed when their group returns (:mod:`.resume`)."""

"""Counters, gauges and histograms (:mod:`.metrics`); the watchdog over blocking Kafka calls
(:mod:`.watchdog`)."""

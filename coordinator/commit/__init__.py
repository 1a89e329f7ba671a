"""The commits: one Kafka transaction per owned partition, under its own transactional producer
(:mod:`.ownership`, :mod:`.writer`); what it carries (:mod:`.content`, ``<ns>_state`` entries:
:mod:`.changelog`; half payloads evicted and re-read: :mod:`.payloads`); group commit on the
commit threads (:mod:`.cycle`); republish spans (:mod:`.tracing`)."""

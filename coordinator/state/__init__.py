"""The owned partitions' state: one half partition's pending transactions and their indexes
(:mod:`.partition` and its parts), back-check timing (:mod:`.scheduler`), the records the next
commits carry (:mod:`.republisher`), and their one owner, :class:`.owned.OwnedPartitions`.

Pure logic: nothing here talks to Kafka or HTTP.
"""

"""The consumer group: the half/op consumer and its settings (:mod:`.consumer`), joining and
rejoining (:mod:`.clients`), the rebalance callbacks (:mod:`.rebalance`) and the restore of a
taken-over partition (:mod:`.restore`), the group's hand-over and refusals (:mod:`.membership`,
:mod:`.copartition`), liveness and readiness (:mod:`.health`)."""

#!/usr/bin/env bash
# Topics and ACLs for txbridge on a cluster where an admin creates topics and
# grants rights (the coordinator and producers need no admin rights then).
#
#   BOOTSTRAP=broker:9092 COMMAND_CONFIG=admin.properties \
#   PRODUCER_PRINCIPAL=User:orders-svc COORDINATOR_PRINCIPAL=User:txbridge \
#   REAL_TOPICS="orders payments" compose/acls.sh
#
# Uses Kafka's own kafka-topics.sh / kafka-acls.sh (from a Kafka distribution on PATH).
set -euo pipefail
: "${BOOTSTRAP:?set BOOTSTRAP}"
NS=${NAMESPACE:-__txbridge}
PARTS=${PARTITIONS:-12}
RF=${REPLICATION_FACTOR:-3}
CFG=()
[ -n "${COMMAND_CONFIG:-}" ] && CFG=(--command-config "$COMMAND_CONFIG")
DAY=86400000

topic() {  # name partitions configs...
  local name=$1 parts=$2; shift 2
  local args=()
  for c in "$@"; do args+=(--config "$c"); done
  kafka-topics.sh --bootstrap-server "$BOOTSTRAP" "${CFG[@]}" --create --if-not-exists \
    --topic "$name" --partitions "$parts" --replication-factor "$RF" "${args[@]}"
}

# Same settings as `txbridge init` (txbridge/topics.py); half, op and state co-partitioned.
topic "${NS}_half" "$PARTS" cleanup.policy=delete retention.ms=$((7 * DAY)) message.timestamp.type=LogAppendTime
topic "${NS}_op" "$PARTS" cleanup.policy=delete retention.ms=$((7 * DAY)) message.timestamp.type=LogAppendTime
topic "${NS}_state" "$PARTS" cleanup.policy=compact min.compaction.lag.ms=0
topic "${NS}_producers" 1 cleanup.policy=compact message.timestamp.type=LogAppendTime
topic "${NS}_expired" 1 cleanup.policy=delete retention.ms=$((30 * DAY))
topic "${NS}_quarantine" 1 cleanup.policy=delete retention.ms=$((30 * DAY))

acl() { kafka-acls.sh --bootstrap-server "$BOOTSTRAP" "${CFG[@]}" --add "$@"; }

if [ -n "${PRODUCER_PRINCIPAL:-}" ]; then
  # Producers write half and op records and heartbeat to the registry; idempotent writes.
  for t in "${NS}_half" "${NS}_op" "${NS}_producers"; do
    acl --allow-principal "$PRODUCER_PRINCIPAL" --operation Write --operation Describe --topic "$t"
  done
  acl --allow-principal "$PRODUCER_PRINCIPAL" --operation IdempotentWrite --cluster
fi

if [ -n "${COORDINATOR_PRINCIPAL:-}" ]; then
  P=$COORDINATOR_PRINCIPAL
  for t in "${NS}_half" "${NS}_op" "${NS}_state" "${NS}_producers" "${NS}_expired"; do
    acl --allow-principal "$P" --operation Read --operation Describe --topic "$t"
  done
  for t in "${NS}_op" "${NS}_state" "${NS}_expired" "${NS}_quarantine" ${REAL_TOPICS:-}; do
    acl --allow-principal "$P" --operation Write --operation Describe --topic "$t"
  done
  acl --allow-principal "$P" --operation Read --group "${GROUP:-txbridge-coordinator}"
  acl --allow-principal "$P" --operation Write --operation Describe \
    --transactional-id "${GROUP:-txbridge-coordinator}" --resource-pattern-type prefixed
fi

#!/bin/sh
# wait-for-kafka COMMAND...: run COMMAND once Kafka answers at $KAFKA_BOOTSTRAP_SERVERS, asked
# with the client settings of $TXBRIDGE_COMMAND_CONFIG (as every txbridge command is).
# A cluster started beside this one takes a while to answer; $TXBRIDGE_WAIT_S (default 120)
# bounds the wait, then the last answer (refused, authentication failed, ...) is printed.
set -eu
: "${KAFKA_BOOTSTRAP_SERVERS:?set KAFKA_BOOTSTRAP_SERVERS}"
limit=${TXBRIDGE_WAIT_S:-120}
deadline=$(( $(date +%s) + limit ))
answer=$(mktemp)
until txbridge kafka status --bootstrap "$KAFKA_BOOTSTRAP_SERVERS" >"$answer" 2>&1; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    cat "$answer" >&2
    echo "wait-for-kafka: no answer from Kafka at $KAFKA_BOOTSTRAP_SERVERS within ${limit}s" >&2
    exit 1
  fi
  sleep 2
done
rm -f "$answer"
exec "$@"

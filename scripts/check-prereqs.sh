#!/usr/bin/env bash
# Checks what must already be on the machine before `make` builds the venv:
# Python 3.11+, a JDK 17+ and Maven. Prints what to install when one is missing.
set -u
fail=0
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
  done
fi
if [ -z "$py" ] || ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "missing: Python 3.11+ (found: ${py:-none}); install it, or set PYTHON=/path/to/python3.11" >&2
  fail=1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "missing: a JDK 17+ (java not on PATH); Debian: apt-get install openjdk-17-jdk-headless" >&2
  fail=1
else
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    echo "missing: a JDK 17+ (found Java ${major:-unknown}); Debian: apt-get install openjdk-17-jdk-headless" >&2
    fail=1
  fi
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "missing: Maven 3.6+ (mvn not on PATH); Debian: apt-get install maven" >&2
  fail=1
fi
[ "$fail" -eq 0 ] || exit 1
echo "$py"

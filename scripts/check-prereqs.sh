#!/usr/bin/env bash
# Checks what must already be on the machine before `make` builds the venv:
# Python 3.11+, a JDK 17+ and Maven. Prints what to install when one is missing.
set -u
fail=0
ok_python() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
py=""
if [ -n "${PYTHON:-}" ]; then
  ok_python "$PYTHON" && py="$PYTHON"
else
  # A name on PATH may be a shim that does not run (pyenv): try each until one works.
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1 && ok_python "$cand"; then py="$cand"; break; fi
  done
fi
if [ -z "$py" ]; then
  echo "missing: Python 3.11+ (none of python3.11/3.12/3.13/python3 runs as 3.11+); install it, or set PYTHON=/path/to/python3.11" >&2
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

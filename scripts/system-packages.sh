#!/usr/bin/env bash
# Debian packages the tests use beside the venv: headless Chromium and its driver (the
# console's browser test) and promtool (from `prometheus`, which validates the alert rules).
# Installed with apt-get when missing and running as root; otherwise says what to install.
# It never fails `make`: the tests that need a missing tool say so themselves.
set -u
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "warning: apt-get install ${missing[*]} failed; the console and alert-rule tests will fail" >&2
  fi
else
  echo "warning: missing ${missing[*]}; as root: apt-get install ${missing[*]}" >&2
fi
exit 0

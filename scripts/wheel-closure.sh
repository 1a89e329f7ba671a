#!/bin/sh
# What a bare `pip install` of txbridge's wheel brings: the wheel is built from a commit (HEAD by
# default, so the figure is of what is committed, not of the work tree), installed into a fresh
# venv with no extras, and the installed distributions (less pip and setuptools) and the size of
# site-packages are printed.
#   scripts/wheel-closure.sh [COMMIT] [WORKDIR]    e.g. scripts/wheel-closure.sh HEAD~3 /tmp/closure
# Needs python3.11 and the package index (docs/install.md quotes its figures).
set -eu
commit=${1:-HEAD}
work=${2:-$(mktemp -d)}
python=${PYTHON:-python3.11}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)

rm -rf "$work/src" "$work/wheel" "$work/venv"
mkdir -p "$work/src" "$work/wheel"
git -C "$root" archive "$commit" | tar -x -C "$work/src"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip setuptools
"$work/venv/bin/python" -m pip wheel -q --no-deps -w "$work/wheel" "$work/src"
"$work/venv/bin/python" -m pip install -q "$work"/wheel/*.whl

site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
packages=$("$work/venv/bin/python" -m pip list --format=freeze | grep -viE '^(pip|setuptools)==')
count=$(printf '%s\n' "$packages" | wc -l)
# site-packages less pip and setuptools, which every venv has
megabytes=$(du -sm --exclude='pip' --exclude='pip-*' --exclude='setuptools' --exclude='setuptools-*' \
    --exclude='_distutils_hack' --exclude='distutils-precedence.pth' --exclude='pkg_resources' "$site" | cut -f1)
printf '%s\n' "$packages" | sed 's/^/  /'
echo "txbridge wheel at $(git -C "$root" rev-parse --short "$commit"): $count packages (txbridge included), ${megabytes} MB of site-packages (pip and setuptools excluded)"

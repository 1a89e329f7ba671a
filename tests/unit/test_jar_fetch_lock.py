"""Processes that need one jar set at once (pytest-xdist's workers on a fresh clone) fetch it once:
before the lock each ran mvn, and each emptied the folder under the others' mvn, which failed."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

# Stands in for Maven: one second to copy, each run counted.
_FAKE_MVN = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}" ;; esac
done
echo run >> "$FAKE_MVN_RUNS"
mkdir -p "$out" && sleep 1 && echo jar > "$out/fake-1.0.jar"
"""

_FETCH = """
import sys
from pathlib import Path
from servers.jars import JarSet, ensure_jars
jars = ensure_jars(JarSet("fake-1.0", ("org.example:fake:1.0",)), root=Path(sys.argv[1]))
print(sorted(p.name for p in jars.glob("*.jar")))
"""


def test_three_processes_needing_one_jar_set_run_one_fetch_and_all_get_its_jars(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(_FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    runs = tmp_path / "runs"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_MVN_RUNS": str(runs)}
    root = Path(__file__).resolve().parents[2]
    fetchers = [
        subprocess.Popen(
            [sys.executable, "-c", _FETCH, str(tmp_path / "cache")],
            env=env,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(p.wait(60), *p.communicate()) for p in fetchers]

    assert [(code, out.strip()) for code, out, _ in results] == [(0, "['fake-1.0.jar']")] * 3, results
    assert runs.read_text().splitlines() == ["run"]  # one fetch; the others waited for it

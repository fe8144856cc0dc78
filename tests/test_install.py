"""The built wheel (the README's "Install" section) holds every file the package reads at run
time, and the demo runs from it alone, outside the clone."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_built_wheel_carries_its_files_and_runs_the_demo(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path / "dist"), str(REPO)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("stickless-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "stickless"
    read_at_run_time = [
        *package.glob("backends/redis/lua/*.lua"),
        *package.glob("web/static/*"),
        package / "py.typed",
    ]
    wanted = {str(path.relative_to(REPO)) for path in read_at_run_time}
    assert wanted - names == set()
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    env = {**os.environ, "PYTHONPATH": str(target)}
    demo = subprocess.run(
        [sys.executable, "-m", "stickless", "demo", "--timeout", "120"],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    shown = subprocess.run(
        [sys.executable, "-c", "import stickless; print(stickless.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert shown.stdout.strip().startswith(str(target))

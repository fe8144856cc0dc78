"""The package as the README's "Install" section gets it (a built wheel; pip from a git URL)
holds every file the package reads at run time, and the demo runs from it alone, outside the
clone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _read_at_run_time() -> set[str]:
    """The package's files that are not Python but are read at run time, relative to the repo."""
    package = REPO / "stickless"
    files = [
        *package.glob("backends/redis/lua/*.lua"),
        *package.glob("web/static/*"),
        package / "py.typed",
    ]
    return {str(path.relative_to(REPO)) for path in files}


def _runs_the_demo(site: Path, cwd: Path) -> None:
    """`python -m stickless demo` succeeds importing stickless from `site` alone.

    `-S` leaves out the `.pth` files of this environment (an editable install of the clone
    adds an import hook that would serve any module `site` lacks); its dependencies come from
    the environment's own package directories, named on the path instead.
    """
    paths = sysconfig.get_paths()
    path = os.pathsep.join(dict.fromkeys([str(site), paths["purelib"], paths["platlib"]]))
    env = {**os.environ, "PYTHONPATH": path}
    demo = subprocess.run(
        [sys.executable, "-S", "-m", "stickless", "demo", "--timeout", "120"],
        capture_output=True, text=True, timeout=180, check=False, cwd=cwd, env=env,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    shown = subprocess.run(
        [sys.executable, "-S", "-c",
         "import stickless.demo.agent, stickless.web; "
         "print(stickless.demo.agent.__file__, stickless.web.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=cwd, env=env,
    )  # fmt: skip
    assert all(file.startswith(str(site)) for file in shown.stdout.split())


@pytest.mark.timeout(300)
def test_the_built_wheel_carries_its_files_and_runs_the_demo(tmp_path: Path) -> None:
    # Built from a copy of the clone without earlier build output: setuptools builds in the
    # source tree, and a `build/` left there by another build would lend the wheel its files.
    source = tmp_path / "source"
    leftovers = shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".*_cache", "node_modules"
    )
    shutil.copytree(REPO, source, ignore=leftovers)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("stickless-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert _read_at_run_time() - names == set()
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    _runs_the_demo(target, tmp_path)


@pytest.mark.timeout(300)
def test_pip_install_from_a_git_url_carries_its_files_and_runs_the_demo(tmp_path: Path) -> None:
    # The committed state (HEAD's commit) of this checkout, as `pip install git+<url>` gets it.
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         f"git+file://{REPO}@{head}"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    there = {str(path.relative_to(target)) for path in target.glob("stickless/**/*")}
    assert _read_at_run_time() - there == set()
    _runs_the_demo(target, tmp_path)

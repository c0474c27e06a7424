"""One supported-release list (flashtree/patches/adapters/RELEASES): adapters, scripts, requirements and the README
agree with it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from flashtree.patches import adapters

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"\b0\.\d+\.\d+\b")


def test_every_listed_release_has_an_adapter_and_requirements():
    assert adapters.SUPPORTED == adapters.read_releases() and len(adapters.SUPPORTED) == len(set(adapters.SUPPORTED))
    assert tuple(a.release for a in adapters.ADAPTERS) == adapters.SUPPORTED
    for release in adapters.SUPPORTED:
        assert (ROOT / f"requirements/sglang-{release}.txt").is_file(), release
        assert f"sglang=={release}" in (ROOT / f"requirements/sglang-{release}.txt").read_text(), release
    folder = ROOT / "flashtree/patches/adapters"
    on_disk = {p.stem for p in folder.glob("sglang_*.py")}
    assert on_disk == {adapters.adapter_module(r).rpartition(".")[2] for r in adapters.SUPPORTED}, "an adapter not listed"
    pinned = {p.name for p in (ROOT / "requirements").glob("sglang-*.txt")}
    assert pinned == {f"sglang-{r}.txt" for r in adapters.SUPPORTED}, "requirements for a release not listed"


def test_read_releases_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "RELEASES"
    path.write_text("# header\n\n0.5.17\n  0.5.20  # note\n")
    assert adapters.read_releases(path) == ("0.5.17", "0.5.20")


def test_scripts_hold_no_release_list():
    for name in ("setup_sglang.sh", "test_patches.sh"):
        assert RELEASE.findall((ROOT / "scripts" / name).read_text()) == [], name
    for path in (ROOT / "scripts").glob("*.sh"):  # the live scripts name the one release the H200 runs, no more
        assert len(set(RELEASE.findall(path.read_text())) & set(adapters.SUPPORTED)) <= 1, path.name


def _bash(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_setup_script_reads_the_list():
    listed = _bash("scripts/setup_sglang.sh", "--list")
    assert listed.returncode == 0 and tuple(listed.stdout.split()) == adapters.SUPPORTED
    refused = _bash("scripts/setup_sglang.sh", "0.4.0")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"setup_sglang.sh: unsupported sglang release '0.4.0'; supported: {' '.join(adapters.SUPPORTED)}"
    )


def test_test_patches_script_runs_every_listed_release(tmp_path):
    """In a copy of the scripts with another list, test_patches.sh goes through that list (each release's setup then
    stops at its missing requirements file, before any venv is made)."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    (tmp_path / "flashtree/patches/adapters").mkdir(parents=True)
    (tmp_path / "flashtree/patches/adapters/RELEASES").write_text("# test list\n9.1.0\n9.2.0\n")
    out = _bash("scripts/test_patches.sh", cwd=tmp_path)
    assert out.returncode == 1
    assert re.findall(r"=== sglang (\S+)", out.stdout) == ["9.1.0", "9.2.0"]
    assert "missing requirements/sglang-9.1.0.txt" in out.stderr and not list(tmp_path.glob(".venv*"))


def test_readme_names_the_listed_releases():
    readme = (ROOT / "flashtree/patches/README.md").read_text()
    section = readme.split("## Supported sglang releases", 1)[1].split("\n## ", 1)[0]
    first = section.strip().split("\n\n", 1)[0]
    named = re.sub(r"\([^)]*\)", "", first.split("flashtree: FLASHTREE_*")[0])  # less the asides: "(... flashmap 0.1.0 ...)"
    assert RELEASE.findall(named) == list(adapters.SUPPORTED)
    assert f"supported releases: {', '.join(adapters.SUPPORTED)} …" in first
    server = readme.split("## Server command", 1)[1].split("\n## ", 1)[0]
    listed = re.search(r"next to sglang (.*)", server).group(1)
    assert RELEASE.findall(listed) == list(adapters.SUPPORTED)

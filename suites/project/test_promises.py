"""README.md's promises: the commands it gives are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ci_test_command():
    match = re.search(r"^TEST_COMMAND='(.+)'$", (ROOT / ".ci/run").read_text(), re.M)
    assert match, ".ci/run has no TEST_COMMAND line"
    return match.group(1)


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    readme = (ROOT / "README.md").read_text()
    assert f"{ci_test_command()}`" in readme or f"{ci_test_command()}\n" in readme


def test_the_layout_in_the_readme_names_only_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    for name in re.findall(r"^\s*(\S+\.py|\S+/)\s", section, re.M):
        assert (ROOT / name).exists() or any(ROOT.rglob(name.rstrip("/"))), name

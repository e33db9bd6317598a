"""README.md's promises: the commands it gives are the ones CI runs."""

import re
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ci_test_command():
    match = re.search(r"^TEST_COMMAND='(.+)'$", (ROOT / ".ci/run").read_text(), re.M)
    assert match, ".ci/run has no TEST_COMMAND line"
    return match.group(1)


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    readme = (ROOT / "README.md").read_text()
    assert f"{ci_test_command()}`" in readme or f"{ci_test_command()}\n" in readme


def test_the_code_map_names_only_files_that_exist_and_every_package_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    section = layout.split("## Code map", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^\s*(\S+\.py|\S+/)\s", section, re.M)
    assert len(names) > 20  # the map is read
    for name in names:
        assert (ROOT / name).exists() or any(ROOT.rglob(name.rstrip("/"))), name
    # Every module of the package is on the map: by its path, or by its file name (or a
    # pattern such as *_props.py) in its folder's entry.
    patterns = re.findall(r"[\w*]*\*[\w*]*\.py", section)
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "treespec").rglob("*.py")
               if p.name != "__init__.py" and (p.parent / "__init__.py").exists()
               and not re.search(rf"(?<![\w.]){re.escape(p.name)}", section)
               and not any(fnmatch(p.name, pat) for pat in patterns)]
    assert missing == []

"""The package's layering, read from its source: imports only go downward (no
cycle), no module imports a package module inside a function (the way to
dodge a cycle), no module assigns another package module's attributes at
run time (pass an ``adapter=`` / ``walk=`` instead), and no module is over
about 500 lines. Each check is first shown to fire on a planted package.

Two run-time imports are allowed, and counted: the command line's dispatch
table (``COMMANDS`` in treespec/cli/main.py, subcommand -> "module:function",
imported with importlib once the flags have parsed, so ``--help`` and flag
errors need no heavy import) and the package's lazy exports (``EXPORTS`` in
treespec/__init__.py: ``treespec.decoding``, imported on first use so that
``import treespec`` stays light). Each target of either table is an edge of
the import graph, so the cycle check sees through it."""

from pathlib import Path

import pytest

from suites.project.helpers import cycles, read

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def _plant(tmp_path, files: dict) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checks_fire_on_a_planted_package(tmp_path):
    root = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import f\n",
        "b.py": "def f():\n    from . import a\n    return a\n",  # a cycle, dodged in a function
        "c.py": "from . import b\n\ndef g():\n    b.f = None\n    setattr(b, 'f', None)\n",
        "sub/__init__.py": "from .d import h\n",
        "sub/d.py": "from .. import a\n\ndef h():\n    return a\n",
        # a dispatch table whose target imports the dispatcher: a cycle through the table
        "e.py": "import importlib\nCOMMANDS = {'x': 'pkg.f:run'}\n\n"
                "def go():\n    return importlib.import_module('pkg.f')\n",
        "f.py": "from . import e\n\ndef run():\n    return e\n",
    })
    known, found = read(root, "pkg")
    assert cycles(found.edges) == [["pkg.a", "pkg.b"], ["pkg.e", "pkg.f"]]
    assert found.dispatch == {"pkg.e": {"x": "pkg.f:run"}}
    assert found.run_time_imports == [("pkg.e", 5)]
    assert found.function_imports == [("pkg.b", 2, "pkg.a")]
    assert [(m, t) for m, _, t in found.patches] == [("pkg.c", "b.f"), ("pkg.c", "setattr(b, ...)")]
    assert found.edges["pkg.sub.d"] == {"pkg.a"} and found.edges["pkg.sub"] == {"pkg.sub.d"}


@pytest.fixture(scope="module")
def treespec_source():
    return read(ROOT, "treespec")


def test_the_package_imports_only_downward(treespec_source):
    _, found = treespec_source
    assert "treespec.rollback" in found.edges["treespec.verify.adapter"]  # the graph is read
    assert cycles(found.edges) == []


def test_no_package_module_is_imported_inside_a_function(treespec_source):
    _, found = treespec_source
    assert found.function_imports == []


def test_the_only_run_time_imports_are_the_two_tables_and_the_users_adapter(treespec_source):
    # treespec.cli.main: its COMMANDS table; treespec: its lazy EXPORTS (both counted as
    # edges, above). treespec.audit.subject: the user's own `--adapter module:attr`, code
    # outside the package.
    _, found = treespec_source
    assert sorted({m for m, _ in found.run_time_imports}) == ["treespec", "treespec.audit.subject",
                                                              "treespec.cli.main"]
    assert set(found.dispatch) == {"treespec", "treespec.cli.main"}
    for module, table in found.dispatch.items():
        assert {t.partition(":")[0] for t in table.values()} <= found.edges[module]


def test_no_package_module_patches_another_at_run_time(treespec_source):
    _, found = treespec_source
    assert found.patches == []


def test_every_package_module_is_one_idea_of_at_most_about_500_lines(treespec_source):
    known, _ = treespec_source
    assert {m.name: m.lines for m in known.values() if m.lines > MAX_LINES} == {}

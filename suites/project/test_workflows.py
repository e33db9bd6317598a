"""The macOS workflow (.github/workflows/macos.yml) runs what the project says,
as suites/project/test_promises.py checks .ci/run: every ``python -m pytest``
command names test paths that exist, options this project's pytest registers
(read by the parser pytest itself parses a command line with) and markers it
knows; the jobs run on ``macos-14``, the exactness suite on Metal and on MLX's
CPU backend under ``--strict-verdicts``, and a job triggered by hand records
both devices' goldens and uploads ``golden``; README.md's macOS section gives
the same commands.

The workflow is read without a YAML library (none is a dependency) by a reader
of the subset it uses, which refuses anything else (a ``run: |`` block, flow
collections), so no command can hide where the reader does not look. Each
check is shown to fire on a planted mistake (``PLANTED`` below)."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "macos.yml"
RUNNER = "macos-14"
EXACTNESS = {"exactness-metal": "gpu", "exactness-cpu": "cpu"}  # job -> its --device
GOLDENS = "record-goldens"
GOLDENS_MARKER = "goldens"  # the tests that pin goldens (suites/goldens.py)
README_SECTION = "## macOS (Apple Silicon)"


class WorkflowSyntax(ValueError):
    """A line outside the YAML subset this reader knows."""


# ----------------------------------------------------------------------------- the reader

LINE = re.compile(r"^(?P<indent> *)(?P<dash>- )?(?P<key>[\w.-]+):(?: +(?P<value>.+))?$")


def _uncommented(line: str) -> str:
    """The line without a `` #`` comment (a ``#`` inside quotes is kept)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(value):
    if value is None:
        return None
    if value[0] in "|>&*[{!":
        raise WorkflowSyntax(f"{value!r}: block scalars, anchors, tags and flow collections "
                             "are outside the subset this reader checks")
    if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _lines(text: str) -> list:
    """(line number, column of the key or dash, dash?, key, value) per line that holds one."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = _uncommented(raw)
        if not line.strip():
            continue
        m = LINE.match(line)
        if m is None:
            raise WorkflowSyntax(f"line {n}: not `key: value` nor `- key: value`: {raw.strip()!r}")
        try:
            value = _scalar(m["value"])
        except WorkflowSyntax as e:
            raise WorkflowSyntax(f"line {n}: {e}")
        out.append((n, len(m["indent"]), bool(m["dash"]), m["key"], value))
    return out


def _node(lines: list, i: int):
    """The mapping or list starting at ``lines[i]``; returns it and the next index."""
    col, dash = lines[i][1], lines[i][2]
    if not dash:
        return _mapping(lines, i, col)
    items = []
    while i < len(lines) and lines[i][1] == col and lines[i][2]:
        item, i = _mapping(lines, i, col + 2)
        items.append(item)
    return items, i


def _mapping(lines: list, i: int, keycol: int):
    out = {}
    while i < len(lines):
        n, col, dash, key, value = lines[i]
        start = col + 2 if dash else col
        if (dash and out) or start < keycol:  # the next list item, or back to the parent
            break
        if start > keycol or dash and start != keycol:
            raise WorkflowSyntax(f"line {n}: {key!r} indented unlike its mapping")
        if key in out:
            raise WorkflowSyntax(f"line {n}: {key!r} given twice")
        i += 1
        if value is None and i < len(lines) and lines[i][1] > start:
            value, i = _node(lines, i)
        out[key] = value
    return out, i


def read_workflow(text: str) -> dict:
    lines = _lines(text)
    if not lines:
        raise WorkflowSyntax("no content")
    tree, i = _node(lines, 0)
    if i != len(lines) or not isinstance(tree, dict):
        raise WorkflowSyntax(f"line {lines[min(i, len(lines) - 1)][0]}: outside the document's "
                             "mapping")
    return tree


# ----------------------------------------------------------------------------- the checks


def pytest_commands(run: str) -> list:
    """The ``python -m pytest`` commands of a shell line, as argument lists."""
    out = []
    for part in run.split("&&"):
        words = shlex.split(part)
        if words[:3] == ["python", "-m", "pytest"]:
            out.append(words[3:])
    return out


def _steps(job: dict) -> list:
    steps = job.get("steps")
    return steps if isinstance(steps, list) else []


def job_commands(job: dict) -> list:
    return [args for step in _steps(job) for args in pytest_commands(step.get("run") or "")]


def command_problems(args: list, parser, markers: set) -> list:
    """What is wrong with one pytest command's arguments: unknown options, a
    value pytest refuses, paths that do not exist, markers not registered."""
    where = "python -m pytest " + " ".join(args)
    try:
        ns, unknown = parser.parse_known_and_unknown_args(args)
    except pytest.UsageError as e:  # a value pytest refuses
        said = re.search(r"error: (.*)", str(e))
        return [f"{where}: pytest refuses it: {said.group(1) if said else e}"]
    out = [f"{where}: {word!r} is not an option pytest registers here"
           for word in unknown if word.startswith("-")]
    for path in ns.file_or_dir:
        if not (ROOT / path.split("::")[0]).exists():
            out.append(f"{where}: no such test path {path!r}")
    names = set(re.findall(r"\w+", ns.markexpr or "")) - {"and", "or", "not"}
    out += [f"{where}: marker {m!r} is not registered" for m in sorted(names - markers)]
    return out


def parsed(args: list, parser) -> list:
    """[the parsed namespace], or [] where pytest refuses the command (said
    by command_problems)."""
    try:
        return [parser.parse_known_and_unknown_args(args)[0]]
    except pytest.UsageError:
        return []


def _setup_python_ok(job: dict) -> bool:
    return any((s.get("uses") or "").startswith("actions/setup-python@")
               and (s.get("with") or {}).get("python-version") == "3.11"
               and (s.get("with") or {}).get("architecture") == "arm64" for s in _steps(job))


def workflow_problems(wf: dict, parser, markers: set) -> list:
    out = []
    on = wf.get("on") or {}
    out += [f"the workflow is not triggered by {t}" for t in ("push", "pull_request",
                                                             "workflow_dispatch") if t not in on]
    jobs = wf.get("jobs") or {}
    for name in (*EXACTNESS, GOLDENS):
        job = jobs.get(name)
        if not isinstance(job, dict):
            out.append(f"no job {name}")
            continue
        if job.get("runs-on") != RUNNER:
            out.append(f"{name} runs on {job.get('runs-on')!r}, not {RUNNER}")
        if not _setup_python_ok(job):
            out.append(f"{name} sets up no arm64 Python 3.11 (actions/setup-python)")
        if not any(s.get("run") == 'python -m pip install -e ".[test]"' for s in _steps(job)):
            out.append(f'{name} does not install the project: python -m pip install -e ".[test]"')
    for name, job in jobs.items():  # every job's commands, the three above or any other
        for args in job_commands(job):
            out += command_problems(args, parser, markers)
        out += [f"{name}: `{part.strip()}` runs pytest other than as `python -m pytest`"
                for step in _steps(job) for part in (step.get("run") or "").split("&&")
                if "pytest" in part and shlex.split(part)[:3] != ["python", "-m", "pytest"]]
    for name, device in EXACTNESS.items():
        job = jobs.get(name) or {}
        if job.get("if") != "github.event_name != 'workflow_dispatch'":
            out.append(f"{name} must run on push and pull_request, not on workflow_dispatch")
        commands = [ns for a in job_commands(job) for ns in parsed(a, parser)]
        if not any(ns.markexpr == "exactness" and getattr(ns, "device", None) == device
                   and getattr(ns, "strict_verdicts", False) for ns in commands):
            out.append(f"{name} runs no `-m exactness --device {device} --strict-verdicts`")
    job = jobs.get(GOLDENS) or {}
    if job.get("if") != "github.event_name == 'workflow_dispatch'":
        out.append(f"{GOLDENS} must run only when triggered by hand (workflow_dispatch)")
    steps = _steps(job)
    recorded = {}
    for at, step in enumerate(steps):
        for args in pytest_commands(step.get("run") or ""):
            for ns in parsed(args, parser):
                if ns.markexpr == GOLDENS_MARKER and not ns.file_or_dir \
                        and getattr(ns, "update_snapshots", False):
                    recorded[getattr(ns, "device", None)] = at
    for device in ("gpu", "cpu"):
        if device not in recorded:
            out.append(f"{GOLDENS} does not record the goldens with --device {device}")
    uploads = [at for at, s in enumerate(steps)
               if (s.get("uses") or "").startswith("actions/upload-artifact@")
               and (s.get("with") or {}).get("path", "").rstrip("/") == "golden"]
    if not uploads or recorded and uploads[-1] < max(recorded.values()):
        out.append(f"{GOLDENS} does not upload golden after recording it")
    return out


def readme_section(readme: str) -> str:
    return readme.split(README_SECTION, 1)[1].split("\n## ", 1)[0] if README_SECTION in \
        readme else ""


def readme_commands(section: str) -> list:
    """The ``python -m pytest`` commands of the section's code blocks, comments dropped."""
    blocks = re.findall(r"^```\n(.*?)^```$", section, re.M | re.S)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for b in blocks for line in b.splitlines()]
    return [line for line in lines if line.startswith("python -m pytest")]


def linux_first_half() -> str:
    run = (ROOT / ".ci" / "run").read_text()
    return re.search(r"^TEST_COMMAND='(.+)'$", run, re.M).group(1).split(" && ")[0]


def readme_problems(readme: str, wf: dict) -> list:
    section = readme_section(readme)
    if not section:
        return [f"README.md has no section {README_SECTION!r}"]
    given = set(readme_commands(section))
    ran = {" ".join(["python -m pytest", *args]) for job in (wf.get("jobs") or {}).values()
           for args in job_commands(job)}
    out = [f"README's macOS section does not give the workflow's `{c}`"
           for c in sorted(ran - given)]
    out += [f"README's macOS section gives `{c}`, which the workflow does not run"
            for c in sorted(given - ran - {linux_first_half()})]
    if linux_first_half() not in given:
        out.append(f"README's macOS section lacks the Linux command's first half, "
                   f"`{linux_first_half()}`")
    if 'pip install -e ".[test]"' not in section:
        out.append('README\'s macOS section does not say `pip install -e ".[test]"`')
    return out


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def pytest_parser(pytestconfig):
    if not pytestconfig.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist is not loaded here (-p no:xdist): the workflow's -n cannot be "
                    "checked")
    # The parser this very run parsed its command line with: every plugin's
    # and conftest's options (a private attribute; pytest has no public one).
    return pytestconfig._parser


@pytest.fixture(scope="module")
def markers(pytestconfig):
    return {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}


def test_the_reader_reads_the_subset_and_refuses_the_rest():
    text = ("on:\n  push:\njobs:  # c\n  a:\n    runs-on: x\n    steps:\n      - uses: u@1\n"
            "        with:\n          path: golden/\n      - run: \"echo '#1' && b\"  # said\n")
    assert read_workflow(text) == {"on": {"push": None}, "jobs": {"a": {"runs-on": "x", "steps": [
        {"uses": "u@1", "with": {"path": "golden/"}}, {"run": "echo '#1' && b"}]}}}
    for bad in ("jobs:\n  a:\n    steps:\n      - run: |\n          python -m pytest\n",
                "jobs: {a: 1}\n", "a: 1\na: 2\n", "a:\n  b: 1\n c: 2\n", "just text\n"):
        with pytest.raises(WorkflowSyntax):
            read_workflow(bad)


def test_the_reader_agrees_with_a_yaml_library_where_one_is_installed():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (not a dependency)")
    expected = yaml.safe_load(WORKFLOW.read_text())
    expected["on"] = expected.pop(True)  # YAML 1.1 reads the key `on` as true; GitHub as `on`
    assert read_workflow(WORKFLOW.read_text()) == expected


def test_the_macos_workflow_runs_what_the_project_registers(pytest_parser, markers):
    wf = read_workflow(WORKFLOW.read_text())
    assert set(wf["jobs"]) >= {*EXACTNESS, GOLDENS}  # the file is read
    assert workflow_problems(wf, pytest_parser, markers) == []


def test_the_readme_gives_the_workflows_commands():
    wf = read_workflow(WORKFLOW.read_text())
    readme = (ROOT / "README.md").read_text()
    assert len(readme_commands(readme_section(readme))) >= 4  # the section is read
    assert readme_problems(readme, wf) == []


# (what is replaced in the workflow, by what, what the checks say)
PLANTED = {
    "an option pytest does not register": (
        "--device gpu --strict-verdicts", "--device gpu --strict-verdict",
        "'--strict-verdict' is not an option pytest registers here"),
    "a value pytest refuses": ("-n auto --device cpu", "-n auto --device tpu",
                               "pytest refuses it: argument --device: invalid choice: 'tpu'"),
    "a test path that does not exist": (
        "-m goldens --snapshot-update --device cpu",
        "suites/e2e/test_textdiff.py --snapshot-update --device cpu",
        "no such test path 'suites/e2e/test_textdiff.py'"),
    "the goldens recorded for one file only": (
        "-m goldens --snapshot-update --device gpu",
        "suites/e2e/test_text_diff.py --snapshot-update --device gpu",
        "record-goldens does not record the goldens with --device gpu"),
    "a marker nobody registered": ("-m exactness -n auto --device gpu",
                                   "-m exactnes -n auto --device gpu",
                                   "marker 'exactnes' is not registered"),
    "another runner": (f"runs-on: {RUNNER}", "runs-on: macos-13",
                       "exactness-metal runs on 'macos-13', not macos-14"),
    "a job renamed": ("  exactness-cpu:", "  exactness-accelerate:", "no job exactness-cpu"),
    "the exactness suite not strict": ("--device cpu --strict-verdicts", "--device cpu",
                                       "exactness-cpu runs no `-m exactness --device cpu "
                                       "--strict-verdicts`"),
    "the goldens recorded on every push": (
        "if: github.event_name == 'workflow_dispatch'", "if: always()",
        "record-goldens must run only when triggered by hand"),
    "no manual trigger": ("  workflow_dispatch:\n", "",
                          "the workflow is not triggered by workflow_dispatch"),
    "one device's goldens not recorded": (
        "      - run: python -m pytest -m goldens --snapshot-update --device cpu\n", "",
        "record-goldens does not record the goldens with --device cpu"),
    "the wrong folder uploaded": ("path: golden\n", "path: results\n",
                                  "record-goldens does not upload golden"),
    "x86_64 Python": ("architecture: arm64", "architecture: x64",
                      "sets up no arm64 Python 3.11"),
    "pytest run another way": ("run: python -m pytest -m exactness -n auto --device gpu",
                               "run: pytest -m exactness -n auto --device gpu",
                               "runs pytest other than as `python -m pytest`"),
    "a command in a block the reader skips": (
        "      - run: python -m pytest -m exactness -n auto --device gpu --strict-verdicts\n",
        "      - run: |\n          python -m pytest -m exactness -n auto --device gpu\n",
        "block scalars, anchors, tags and flow collections"),
}


@pytest.mark.parametrize("old,new,says", PLANTED.values(), ids=PLANTED.keys())
def test_each_check_fires_on_a_planted_mistake(pytest_parser, markers, old, new, says):
    text = WORKFLOW.read_text()
    assert old in text, old
    try:
        problems = workflow_problems(read_workflow(text.replace(old, new, 1)), pytest_parser,
                                     markers)
    except WorkflowSyntax as e:
        problems = [str(e)]
    assert any(says in p for p in problems), problems


def test_the_readme_check_fires_when_the_readme_and_the_workflow_disagree():
    wf = read_workflow(WORKFLOW.read_text())
    readme = (ROOT / "README.md").read_text()
    drifted = readme.replace("-n auto --device cpu --strict-verdicts", "-n auto --device cpu", 1)
    assert readme_problems(drifted, wf) == [
        "README's macOS section does not give the workflow's `python -m pytest -m exactness "
        "-n auto --device cpu --strict-verdicts`",
        "README's macOS section gives `python -m pytest -m exactness -n auto --device cpu`, "
        "which the workflow does not run"]
    assert readme_problems(readme.replace(README_SECTION, "## On a Mac"), wf) == [
        f"README.md has no section {README_SECTION!r}"]
    without_full_suite = readme_section(readme).replace("python -m pytest -n auto\n", "", 1)
    assert "lacks the Linux command's first half" in " ".join(
        readme_problems(README_SECTION + without_full_suite, wf))

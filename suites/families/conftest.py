"""Prints the family sweep's table, one line per family, at the end of a run
(from each test's ``family`` property, which pytest-xdist carries back from
its workers)."""


def pytest_terminal_summary(terminalreporter):
    lines = []
    for status in ("passed", "failed"):
        for report in terminalreporter.stats.get(status, []):
            if getattr(report, "when", None) != "call":
                continue
            lines += [v for k, v in getattr(report, "user_properties", ()) if k == "family"]
    if lines:
        terminalreporter.section(f"families ({len(lines)})")
        for line in sorted(lines):
            terminalreporter.write_line(line)

"""A pytest plugin (``-p validation.instant_failures``): a failing test's report is written to
the terminal (a log) as soon as the test fails, not only in the summary at the session's end,
which a process stopped at validation/gpu_suite.py's deadline never writes (a leak test's
failure was lost that way)."""

_config = []        # the session's config, to find its terminal reporter when a test fails


def pytest_configure(config):
    _config[:] = [config]


def pytest_runtest_logreport(report):
    out = _config[0].pluginmanager.get_plugin("terminalreporter") if _config else None
    if report.failed and out is not None:
        out.write_line("")
        out.write_line(f"---- {report.nodeid} failed ({report.when}):")
        for line in report.longreprtext.splitlines():
            out.write_line(line)

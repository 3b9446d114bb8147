"""The grading reporter: a pytest plugin that the grader copies into the grading container,
outside the repository, under a name the agent cannot predict, and loads with `-p` (through
PYTEST_ADDOPTS) so that it is imported before any conftest, entry-point plugin or project
module.

It records every test report as it happens on an inherited pipe to the collector
(collector.py), each record MACed with a per-run key chained over the previous record, and
a `close` record at `pytest_unconfigure`: a process that ends early (`os._exit`) leaves no
close record. The key comes from a file that the plugin deletes as it loads, before any code
of the project runs.

The code under test runs in this same process, so nothing here is out of its reach; what it
buys is that forging the outcome now means attacking this plugin or the runner's internals,
which it checks: every function and class of pytest and pluggy keeps the identity (and code
object) it had when the plugin loaded, the hooks that make and carry reports come from
plugins loaded before the project or from the task's own test files, no tracer or profiler
is installed, and the builtins the runner relies on are the original ones. A few hot checks
run with every record (a patch that restores itself after forging one report is seen);
the full check runs at the end. Findings are records too; the grader scores 0 on any.

The grader writes a copy with KEY_PATH, FD, REPO and PATCHED filled in; with them empty (this file
as shipped) the plugin does nothing.
"""

import builtins
import hashlib
import hmac
import json
import os
import sys
import time
import types

import _pytest.reports
import _pytest.runner
import pluggy._callers
import pytest

KEY_PATH = ""
FD = -1
REPO = "/testbed"
#: repository paths the graded patch writes: their code may not add report hooks or patch pytest
PATCHED = frozenset()

#: hooks that make, classify or carry a report, or run the test call
WATCHED_HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
)
_BUILTINS = ("print", "__import__", "open", "isinstance", "issubclass", "getattr", "setattr", "hasattr", "type", "id")
_MISSING = object()


def _sig(obj):
    """Identities that change when the function `obj` is replaced or patched in place."""
    if isinstance(obj, (classmethod, staticmethod)):
        return (type(obj), _sig(obj.__func__))
    if isinstance(obj, property):
        return (type(obj), _sig(obj.fget), _sig(obj.fset))
    code = getattr(obj, "__code__", None)
    if code is not None:
        return (obj, code, getattr(obj, "__defaults__", None), getattr(obj, "__kwdefaults__", None))
    return (obj,)


def _behaviour(value):
    return isinstance(value, (classmethod, staticmethod, property)) or getattr(value, "__code__", None) is not None


def _functions(value):
    if isinstance(value, (classmethod, staticmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    return [value]


def _same(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b


def _is_runner_module(name):
    return name in ("pytest", "pluggy") or name.startswith(("_pytest.", "pluggy."))


def _runner_snapshot():
    """Every function and class (its methods and properties: its data attributes are state)
    that pytest and pluggy define, as loaded now."""
    snap = {}
    for name, module in list(sys.modules.items()):
        if module is None or not _is_runner_module(name):
            continue
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) != name:
                continue
            if isinstance(value, type):
                members = {k: _sig(v) for k, v in list(vars(value).items()) if _behaviour(v)}
                snap[(name, attr)] = (value, value.__bases__, members)
            elif callable(value):
                snap[(name, attr)] = _sig(value)
        snap[(name, "<module>")] = (module,)
    return snap


def _changed(before, now, trusted):
    """Keys of `before` whose objects changed. A function or class method may be replaced
    (or a method added) only by a function that `trusted` accepts: pytest's own legacypath
    plugin adds properties at configure, installed plugins (hypothesis) patch pytest too."""
    changed = []
    for key, sig in before.items():
        current = now.get(key)
        if isinstance(sig, tuple) and len(sig) == 3 and isinstance(sig[2], dict):
            if current is None or current[0] is not sig[0] or current[1] != sig[1]:
                changed.append(key)
                continue
            members = current[2]
            if any(name not in members for name in sig[2]):
                changed.append(key)
                continue
            for name, member in members.items():
                if name in sig[2] and _same(member, sig[2][name]):
                    continue
                if not all(trusted(f) for f in _functions(vars(sig[0]).get(name))):
                    changed.append(key)
                    break
        elif not _same(current, sig):
            module, attr = key
            value = vars(sys.modules[module]).get(attr) if module in sys.modules and attr != "<module>" else None
            if value is None or not _behaviour(value) or not all(trusted(f) for f in _functions(value)):
                changed.append(key)
    return changed


def _hot():
    report = _pytest.reports.TestReport
    return (
        report,
        _sig(vars(report).get("from_item_and_call")),
        _sig(vars(report).get("__init__")),
        _pytest.runner.CallInfo,
        _sig(vars(_pytest.runner.CallInfo).get("from_call")),
        _sig(_pytest.runner.call_and_report),
        _sig(_pytest.runner.runtestprotocol),
        _sig(_pytest.runner.pytest_runtest_makereport),
        _sig(pluggy._callers._multicall),
        sys.modules.get("_pytest.reports"),
        sys.modules.get("_pytest.runner"),
        sys.gettrace(),
        sys.getprofile(),
    )


def _builtins():
    return tuple(vars(builtins).get(name, _MISSING) for name in _BUILTINS)


class _ScopeSet:
    """Membership by identity (module dicts are not hashable)."""

    def __init__(self, scopes):
        self._ids = {id(s): s for s in scopes}

    def __contains__(self, scope):
        return id(scope) in self._ids and self._ids[id(scope)] is scope


class _Reporter:
    def __init__(self, key, fd):
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._prev = b""
        self._seq = 0
        self._fd = fd
        self._pid = os.getpid()
        self._started = time.time()
        self._modules_before = set(sys.modules)
        self._config = None
        self._raised = {}
        self._runner = _runner_snapshot()
        self._runner_scopes = _ScopeSet(
            vars(sys.modules[m]) for m, attr in self._runner if attr == "<module>" and m in sys.modules
        )
        self._hot = _hot()
        self._builtins = _builtins()
        self._monitoring = self._tools()
        self._hookimpls = None
        self._closed = False
        self._reported = set()
        self._emit("open", {"pid": self._pid, "pytest": pytest.__version__})

    @staticmethod
    def _tools():
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None:
            return ()
        return tuple(monitoring.get_tool(i) for i in range(6))

    def _emit(self, kind, data):
        if self._closed or os.getpid() != self._pid:
            return
        payload = json.dumps([self._seq, kind, data], separators=(",", ":"), ensure_ascii=True).encode()
        mac = self._mac.copy()
        mac.update(self._prev + b"\n" + payload)
        self._prev = mac.hexdigest().encode()
        self._seq += 1
        line = payload + b" " + self._prev + b"\n"
        try:
            while line:
                line = line[os.write(self._fd, line) :]
        except OSError:
            self._closed = True

    # ------------------------------------------------------------------ checks
    def _hot_check(self):
        found = []
        if not _same(_hot(), self._hot):
            found.append("the report machinery was replaced")
        if _builtins() != self._builtins:
            found.append("a builtin was replaced")
        return found

    def _allowed_path(self, path):
        """Outside the repository (installed), or a file of the repository that the patch
        did not touch and nothing changed since this plugin loaded (the task's own code)."""
        path = os.path.realpath(path or "")
        root = REPO.rstrip("/") + "/"
        if not path:
            return False
        if not path.startswith(root):
            return True
        try:
            return path[len(root) :] not in PATCHED and os.stat(path).st_ctime < self._started
        except OSError:
            return False

    def _allowed_module(self, module):
        """Loaded before the project, or from an allowed file."""
        if module is None:
            return False
        if module is sys.modules.get(__name__) or module.__name__ in self._modules_before:
            return True
        return self._allowed_path(getattr(module, "__file__", None))

    def _trusted(self, function):
        """A function of pytest or pluggy as loaded before the project, or of a module from
        an allowed file (what the patch did not write)."""
        scope = getattr(function, "__globals__", None)
        if scope is None:
            return False
        if scope in self._runner_scopes:
            return True
        owner = sys.modules.get(scope.get("__name__", ""))
        return owner is not None and vars(owner) is scope and self._allowed_module(owner)

    def _allowed_impl(self, plugin, function):
        """A watched hook must come from allowed code: both the plugin object's module and
        the module whose globals the function runs with."""
        if plugin is self:
            return True
        module = plugin if isinstance(plugin, types.ModuleType) else sys.modules.get(type(plugin).__module__)
        if not self._allowed_module(module):
            return False
        scope = getattr(function, "__globals__", None)
        if scope is None:
            return False
        if scope is vars(module):
            return True
        owner = sys.modules.get(scope.get("__name__", ""))
        return owner is not None and vars(owner) is scope and self._allowed_module(owner)

    def _full_check(self):
        found = self._hot_check()
        changed = sorted(f"{m}.{a}" for m, a in _changed(self._runner, _runner_snapshot(), self._trusted))
        if changed:
            found.append("pytest or pluggy internals changed: " + ", ".join(changed[:8]))
        if self._tools() != self._monitoring:
            found.append("a sys.monitoring tool was registered")
        if self._config is not None:
            hook = self._config.pluginmanager.hook
            for name in WATCHED_HOOKS:
                caller = getattr(hook, name, None)
                if caller is None:
                    continue
                for impl in caller.get_hookimpls():
                    function = getattr(impl.function, "__func__", impl.function)
                    if not self._allowed_impl(impl.plugin, function):
                        found.append(f"{name} implemented by {impl.plugin_name!r}, loaded by the project")
                    elif (
                        self._hookimpls is not None
                        and (name, id(impl.plugin)) in self._hookimpls
                        and not _same(self._hookimpls[(name, id(impl.plugin))], _sig(function))
                    ):
                        found.append(f"{name} of {impl.plugin_name!r} was replaced")
        return found

    # ------------------------------------------------------------------- hooks
    def configure(self, config):
        self._config = config
        self._hookimpls = {}
        for name in WATCHED_HOOKS:
            caller = getattr(config.pluginmanager.hook, name, None)
            for impl in caller.get_hookimpls() if caller is not None else ():
                self._hookimpls[(name, id(impl.plugin))] = _sig(getattr(impl.function, "__func__", impl.function))

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        outcome = yield
        self._raised[item.nodeid] = outcome.excinfo is not None and not isinstance(
            outcome.excinfo[1], (pytest.skip.Exception, pytest.xfail.Exception)
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid
        try:
            shown = str(self._config.cwd_relative_nodeid(nodeid))
        except Exception:
            shown = nodeid
        data = {"id": shown, "when": report.when, "outcome": report.outcome}
        if hasattr(report, "wasxfail"):
            data["xfail"] = str(report.wasxfail)
        if report.when == "call":
            data["raised"] = self._raised.pop(nodeid, None)
        found = self._hot_check()
        if found:
            data["tamper"] = found
        self._emit("report", data)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self._exitstatus = int(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        if config is not self._config:
            return
        self._emit("close", {"exitstatus": getattr(self, "_exitstatus", None), "tamper": self._full_check()})
        self._closed = True
        try:
            os.close(self._fd)
        except OSError:
            pass


def _hide_from_children():
    """Take this plugin out of the environment the tests' own subprocesses inherit: a pytest
    they start (pytester, a CLI test) must not try to load it."""
    addopts = os.environ.get("PYTEST_ADDOPTS", "")
    ours = "-p " + __name__
    if ours in addopts:
        rest = " ".join(addopts.replace(ours, " ").split())
        if rest:
            os.environ["PYTEST_ADDOPTS"] = rest
        else:
            os.environ.pop("PYTEST_ADDOPTS", None)
    here = os.path.dirname(os.path.abspath(__file__))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here in paths:
        rest = [p for p in paths if p and p != here]
        if rest:
            os.environ["PYTHONPATH"] = os.pathsep.join(rest)
        else:
            os.environ.pop("PYTHONPATH", None)


def _start():
    if not KEY_PATH:
        return None
    _hide_from_children()
    try:
        with open(KEY_PATH, "rb") as f:
            key = f.read()
        os.unlink(KEY_PATH)
        fd = os.dup(FD)
        os.close(FD)
    except OSError:
        return None  # a nested pytest run (the key is gone): inert
    return _Reporter(key, fd)


_REPORTER = _start()


def pytest_configure(config):
    """Register the reporter with the first configuration only: a pytest run nested in
    this process (pytester) gets its own configuration and is not the graded run."""
    if _REPORTER is not None and _REPORTER._config is None:
        _REPORTER.configure(config)
        config.pluginmanager.register(_REPORTER, "rollhub-grading-reporter")

"""Which constructs a patched Python module newly reaches for, judged on the code Python would run.

The library under test is imported into the test process, so a patch that makes it run
arbitrary code, leave the interpreter early, or walk from its own objects to pytest's can
forge a pass. A fix of a library bug needs none of that, so every *new* use of such a
construct is refused: the constructs of the base text and of the patched text are counted
(`constructs`) and any count that grows is reported (`new_constructs`). Counting, not
forbidding, keeps a fix legal in a module that already uses `getattr(obj, name)` or
`re.compile` as long as it adds no further use.

The judgement is made on what Python compiles, not on the diff's lines:

* the text is parsed from its bytes, as the import system does: the source-encoding
  declaration is honoured (a `# coding: utf-7` module hides code in a comment otherwise) and
  a lone `\\r` ends a line, as it does for Python and does not for a diff;
* identifiers are taken from the syntax tree, where Python has already folded them to NFKC
  (`ｅｘｅｃ` is `exec`);
* string constants are folded where the parser or simple arithmetic makes them
  (`'ex' 'ec'`, `'ex' + 'ec'`, `'cexe'[::-1]`, `''.join([...])`, `chr(101)`): a folded string
  that names a forbidden construct counts as that construct; a name that cannot be folded
  may still not reach an attribute (`getattr`/`setattr`/`delattr` with a computed name).

Without the base text (`constructs_of_fragment`) the hunks' own lines are counted word by
word: coarser, and meant only for callers that judge a diff without its repository.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections import Counter

#: builtins that run code from data; as a bare name only (`re.compile` is a different thing)
EXEC_BUILTINS = frozenset(
    {"exec", "eval", "compile", "execfile", "__import__", "breakpoint", "globals", "vars", "locals"}
)
#: attribute names that reach an object's namespace, a frame, the import system or the runner:
#: counted wherever they appear (attribute, name, parameter, keyword, import, folded string)
INTERNAL_NAMES = frozenset(
    {
        "__builtins__",
        "builtins",
        "__builtin__",
        "__dict__",
        "__globals__",
        "__code__",
        "__closure__",
        "__subclasses__",
        "__mro__",
        "__bases__",
        "__base__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__loader__",
        "__spec__",
        "__self__",
        "__func__",
        "__reduce__",
        "__reduce_ex__",
        "__del__",
        "__annotations__",
        "__import__",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "f_trace",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "gi_code",
        "co_code",
        "func_globals",
        "_getframe",
        "_current_frames",
        "settrace",
        "setprofile",
        "meta_path",
        "path_hooks",
        "path_importer_cache",
        "addaudithook",
        "_exit",
        "attrgetter",
        "methodcaller",
        "get_field",
        "get_type_hints",
        "ForwardRef",
        "_eval_type",
        "import_module",
        "currentframe",
        "getouterframes",
        "getinnerframes",
        "walk_stack",
        "get_objects",
        "get_referrers",
        "get_referents",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "modules",
        "excepthook",
        "displayhook",
        "breakpointhook",
        "unraisablehook",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "forkpty",
        "fork",
        "system",
        "abort",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__bool__",
        "__hash__",
        "__instancecheck__",
        "__subclasscheck__",
        "killpg",
        "dup2",
        "fdopen",
        "pytest_plugins",
        "_pytest",
        "pytest",
        "pluggy",
        "conftest",
        "sitecustomize",
        "usercustomize",
    }
)
#: modules a library fix has no business importing or naming: code from data, decoders of
#: hidden payloads, native calls, exit hooks, processes, introspection, the runner itself
FORBIDDEN_MODULES = frozenset(
    {
        "importlib",
        "runpy",
        "imp",
        "pkgutil",
        "zipimport",
        "code",
        "codeop",
        "timeit",
        "doctest",
        "pdb",
        "bdb",
        "pydoc",
        "base64",
        "codecs",
        "binascii",
        "marshal",
        "pickle",
        "_pickle",
        "cPickle",
        "copyreg",
        "shelve",
        "dill",
        "zlib",
        "bz2",
        "lzma",
        "quopri",
        "uu",
        "ctypes",
        "_ctypes",
        "cffi",
        "mmap",
        "atexit",
        "faulthandler",
        "signal",
        "_signal",
        "subprocess",
        "_posixsubprocess",
        "pty",
        "multiprocessing",
        "posix",
        "nt",
        "gc",
        "inspect",
        "traceback",
        "shutil",
        "zipfile",
        "mock",
        "builtins",
        "__builtin__",
        "site",
        "sitecustomize",
        "usercustomize",
        "pytest",
        "_pytest",
        "pluggy",
        "py",
    }
)
#: attributes of otherwise ordinary modules: processes, early exit, descriptors, interpreter state
FORBIDDEN_QUALIFIED = frozenset(
    {
        "os._exit",
        "os.abort",
        "os.kill",
        "os.killpg",
        "os.system",
        "os.popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.posix_spawnp",
        "os.dup",
        "os.close",
        "os.closerange",
        "os.dup2",
        "os.fdopen",
        "os.open",
        "os.write",
        "os.remove",
        "os.unlink",
        "os.rename",
        "os.renames",
        "os.replace",
        "os.rmdir",
        "os.removedirs",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.chmod",
        "os.utime",
        "os.chdir",
        "sys.modules",
        "sys.meta_path",
        "sys.path_hooks",
        "sys.path_importer_cache",
        "sys.path",
        "sys.settrace",
        "sys.setprofile",
        "sys._getframe",
        "sys._current_frames",
        "sys.addaudithook",
        "sys.breakpointhook",
        "sys.excepthook",
        "sys.displayhook",
        "sys.unraisablehook",
        "sys.monitoring",
        "sys.stdout",
        "sys.stderr",
        "sys.__stdout__",
        "sys.__stderr__",
        "operator.attrgetter",
        "operator.methodcaller",
        "types.CodeType",
        "types.FunctionType",
        "types.ModuleType",
        "threading.settrace",
        "threading.setprofile",
        "logging.config",
        "io.open",
        "io.FileIO",
        "unittest.mock",
    }
)
_OS_FAMILIES = re.compile(r"^(os|posix)\.(exec|spawn)(l|le|lp|lpe|v|ve|vp|vpe)$")
#: modules that stay dangerous when reached as an attribute of another module (`os.path.sys`)
_MODULES_AS_ATTRIBUTES = frozenset(
    {"importlib", "runpy", "marshal", "pickle", "ctypes", "atexit", "subprocess", "gc", "inspect", "builtins"}
)
#: attributes that write or remove files (a module may rewrite tests the run has not read yet)
FILE_WRITE_ATTRIBUTES = frozenset(
    {"write_text", "write_bytes", "touch", "unlink", "rmdir", "symlink_to", "hardlink_to"}
)
#: codecs that decode a payload rather than text (`str.encode('rot13')`, `bytes.decode('unicode_escape')`)
PAYLOAD_CODECS = frozenset(
    {
        "rot13",
        "rot_13",
        "base64",
        "base_64",
        "base64_codec",
        "zlib",
        "zip",
        "zlib_codec",
        "hex",
        "hex_codec",
        "bz2",
        "bz2_codec",
        "uu",
        "uu_codec",
        "quopri",
        "quopri_codec",
        "utf7",
        "utf_7",
        "unicode_escape",
        "raw_unicode_escape",
        "punycode",
    }
)
_DANGEROUS_PATH = re.compile(r"(^|/)(proc|dev/fd|dev/stdout|dev/stderr)(/|$)")
#: a path into the tests (a module that rewrites a test file the run has not collected yet)
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)(/|$)|(^|/)test_[^/]*\.py|_tests?\.py$|(^|/)conftest")
#: a file the interpreter loads at start-up or imports without a readable source
_IMPORTABLE_BLOB = re.compile(r"\.(pth|pyc|pyo|so|pyd|zip|egg|whl|pyz)$", re.I)
_DOTTED = re.compile(r"[\w.]+")
_WORD = re.compile(r"[^\W\d]\w*")
#: PEP 263: a comment on line 1 or 2 naming the source encoding
CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.M)
#: in a fragment judged without its base text: names counted unless they follow a dot
#: (`re.compile` is not the builtin), internal names counted anywhere, modules where imported
_FRAGMENT_BARE = EXEC_BUILTINS | {"getattr", "setattr", "delattr"}
_FRAGMENT_BARE_WORD = re.compile(r"(?<![\w.])\s*([^\W\d]\w*)")
_FRAGMENT_IMPORT = re.compile(r"\b(?:import|from)\s+([\w.]+(?:\s*,\s*[\w.]+)*)")
_FRAGMENT_QUALIFIED = re.compile(r"\b(os|sys|operator|types|io)\s*\.\s*(\w+)")


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def encoding_declaration(source: bytes) -> str | None:
    """The source encoding a module declares in its first two lines (normalised), or None."""
    head = b"\n".join(re.split(rb"\r\n|\r|\n", source, maxsplit=2)[:2])
    match = CODING.search(head)
    return match.group(1).decode("ascii", "replace").lower().replace("_", "-") if match else None


_FOLD_LIMIT = 100_000  # characters: `(('a' * 64) * 64) * 64...` must not exhaust the grader's memory


def _fold(node: ast.AST, depth: int = 0) -> str | None:
    """The string an expression always evaluates to, where simple arithmetic on constants
    makes it (None otherwise, and for strings longer than `_FOLD_LIMIT`). Bytes count as
    their latin-1 text."""
    text = _fold_unbounded(node, depth)
    return text if text is None or len(text) <= _FOLD_LIMIT else None


def _fold_unbounded(node: ast.AST, depth: int) -> str | None:
    if depth > 200:
        return None
    sub = depth + 1
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, bytes):
            return node.value.decode("latin-1")
        return None
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Add):
            left, right = _fold(node.left, sub), _fold(node.right, sub)
            return left + right if left is not None and right is not None else None
        if isinstance(node.op, ast.Mult):
            for text_node, count_node in ((node.left, node.right), (node.right, node.left)):
                text = _fold(text_node, sub)
                if text is not None and isinstance(count_node, ast.Constant) and isinstance(count_node.value, int):
                    count = max(0, count_node.value)
                    return text * count if len(text) * count <= _FOLD_LIMIT else None
        if isinstance(node.op, ast.Mod):
            return _fold(node.left, sub)  # the template's own text is what can be judged
        return None
    if isinstance(node, ast.JoinedStr):
        parts = [_fold(v.value if isinstance(v, ast.FormattedValue) else v, sub) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        text = _fold(node.value, sub)
        bounds = [node.slice.lower, node.slice.upper, node.slice.step]
        values = [b.value if isinstance(b, ast.Constant) else None for b in bounds]
        if text is None or any(b is not None and not isinstance(v, int) for b, v in zip(bounds, values)):
            return None
        if values[2] == 0:
            return None
        return text[slice(*values)]
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "chr" and len(node.args) == 1:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and 0 <= arg.value < 0x110000:
                return chr(arg.value)
            return None
        if isinstance(func, ast.Name) and func.id == "str" and len(node.args) == 1:
            return _fold(node.args[0], sub)
        if isinstance(func, ast.Attribute):
            owner = _fold(func.value, sub)
            if owner is None:
                return None
            if func.attr == "join" and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
                parts = [_fold(e, sub) for e in node.args[0].elts]
                return owner.join(parts) if all(p is not None for p in parts) else None
            if func.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "title", "casefold", "swapcase"):
                return getattr(owner, func.attr)() if not node.args else None
            if func.attr in ("decode", "encode", "format"):
                return owner
            if func.attr == "replace" and len(node.args) == 2:
                old, new = _fold(node.args[0], sub), _fold(node.args[1], sub)
                return owner.replace(old, new) if old is not None and new is not None else None
    return None


_NAMED_IN_STRINGS = EXEC_BUILTINS | FORBIDDEN_MODULES | INTERNAL_NAMES | {"getattr", "setattr", "delattr"}
_RUNNER_WORDS = frozenset({"pytest", "pluggy", "conftest", "sitecustomize", "usercustomize", "builtins"})


def _string_constructs(text: str) -> list[str]:
    """The constructs a string names: a dotted name of a forbidden thing (`'exec'`,
    `'os._exit'`, `'_pytest.runner'`), an internal name anywhere in it (`'{0.__globals__}'`),
    a payload codec, a /proc path."""
    found = []
    text = _nfkc(text)
    stripped = text.strip()
    if _DANGEROUS_PATH.search(stripped):
        found.append("path:/proc or /dev/fd")
    if _TEST_PATH.search(stripped):
        found.append("path:tests")
    if _IMPORTABLE_BLOB.search(stripped):
        found.append("path:start-up file or archive")
    if "pytest" in stripped.lower():  # PYTEST_CURRENT_TEST, a plugin name, a module path
        found.append("string:pytest")
    if stripped.lower().replace("-", "_") in PAYLOAD_CODECS:
        found.append(f"codec:{stripped.lower()}")
    if _DOTTED.fullmatch(stripped):  # a name, as getattr / import_module / a format field take it
        parts = stripped.split(".")
        for k, part in enumerate(parts):
            if part in _NAMED_IN_STRINGS:
                found.append(f"string:{part}")
            if ".".join(parts[k : k + 2]) in FORBIDDEN_QUALIFIED:
                found.append(f"string:{'.'.join(parts[k : k + 2])}")
    for word in _WORD.findall(text):  # anywhere in prose: only names no sentence uses
        if word in INTERNAL_NAMES and ("_" in word or word in _RUNNER_WORDS):
            found.append(f"string:{word}")
    return found


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: Counter[str] = Counter()
        self.aliases: dict[str, str] = {}  # local name -> the dotted name it stands for

    def scan(self, tree: ast.AST) -> Counter[str]:
        nodes = list(ast.walk(tree))
        for node in nodes:  # imports first: a use may come before its import
            if isinstance(node, ast.Import):
                for alias in node.names:
                    root = alias.name.split(".")[0]
                    self.aliases[alias.asname or root] = alias.name if alias.asname else root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for _ in range(3):  # `o = os` / `p = os.path`: a module passed on under another name
            for node in nodes:
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    resolved = self._resolve(node.value)
                    if resolved and resolved.split(".")[0] in self.aliases:
                        for target in targets:
                            if isinstance(target, ast.Name) and target.id not in self.aliases:
                                self.aliases[target.id] = resolved
        self.visit(tree)
        return self.found

    def _identifier(self, name: str | None) -> None:
        if name and _nfkc(name) in INTERNAL_NAMES:
            self.found[f"internal:{_nfkc(name)}"] += 1

    def _qualified(self, dotted: str) -> None:
        """A dotted name that Python resolves through modules: `os.system`, `os.path.sys.modules`."""
        parts = dotted.split(".")
        if parts[0] in FORBIDDEN_MODULES:
            self.found[f"module:{parts[0]}"] += 1
        for part in parts[1:]:
            if part in _MODULES_AS_ATTRIBUTES:
                self.found[f"module:{part}"] += 1
        for k in range(len(parts) - 1):
            pair = f"{parts[k]}.{parts[k + 1]}"
            if pair in FORBIDDEN_QUALIFIED or _OS_FAMILIES.match(pair):
                self.found[f"call:{pair}"] += 1

    def _resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._qualified(alias.name)
            for name in (alias.name, alias.asname):
                for part in (name or "").split("."):
                    self._identifier(part)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if not node.level and module:
            self._qualified(module)
            for alias in node.names:
                if alias.name != "*":
                    self._qualified(f"{module.split('.')[-1]}.{alias.name}")
                elif module.split(".")[0] in ("os", "posix", "sys", "builtins", "operator", "types", "io"):
                    self.found[f"star-import:{module}"] += 1
        for part in module.split("."):
            self._identifier(part)
        for alias in node.names:
            self._identifier(alias.name)
            self._identifier(alias.asname)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        resolved = self.aliases.get(name)
        if name in EXEC_BUILTINS and resolved is None:
            self.found[f"builtin:{name}"] += 1
        if name in ("getattr", "setattr", "delattr") and not getattr(node, "_called_with_literal", False):
            self.found[f"dynamic-attribute:{name}"] += 1
        if name == "open" and resolved is None and not getattr(node, "_called", False):
            self.found["file-write:open-as-value"] += 1
        self._identifier(name)
        if resolved is not None:
            self._qualified(resolved)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._identifier(node.attr)
        if node.attr in FILE_WRITE_ATTRIBUTES:
            self.found[f"file-write:{node.attr}"] += 1
        if _OS_FAMILIES.match(f"os.{node.attr}"):
            self.found[f"call:os.{node.attr}"] += 1
        dotted = self._resolve(node)
        if dotted and "." in dotted:
            # each attribute counts the pair it ends; the root is counted where its name is visited
            parts = dotted.split(".")
            last = f"{parts[-2]}.{parts[-1]}"
            if last in FORBIDDEN_QUALIFIED or _OS_FAMILIES.match(last):
                self.found[f"call:{last}"] += 1
            if parts[-1] in _MODULES_AS_ATTRIBUTES:
                self.found[f"module:{parts[-1]}"] += 1
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr", "hasattr"):
            target = node.args[0] if node.args else None
            name = _fold(node.args[1]) if len(node.args) > 1 else None
            if name is not None or func.id == "hasattr":
                func._called_with_literal = True  # type: ignore[attr-defined]
            if name is not None and target is not None:
                name = _nfkc(name)
                owner = self._resolve(target)
                if owner:
                    self._qualified(f"{owner}.{name}")
                if name in EXEC_BUILTINS:
                    self.found[f"builtin:{name}"] += 1
                if name in FILE_WRITE_ATTRIBUTES:
                    self.found[f"file-write:{name}"] += 1
                self._identifier(name)
        resolved = self._resolve(func)
        mode: ast.AST | None = None
        unpacked = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        if isinstance(func, ast.Name) and func.id == "open" or resolved in ("io.open", "codecs.open"):
            func._called = True  # type: ignore[attr-defined]
            mode = node.args[1] if len(node.args) > 1 else None
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, int):
                self.found["file-write:open-descriptor"] += 1
            if unpacked:
                self.found["file-write:open"] += 1
        elif isinstance(func, ast.Attribute) and func.attr == "open":  # Path.open(mode), tarfile.open(path, mode)
            for arg in node.args[:2]:
                text = _fold(arg)
                if text is not None and _MODE.fullmatch(text):
                    mode = arg
        for keyword in node.keywords:
            if keyword.arg in ("mode", None) and (mode is not None or keyword.arg == "mode"):
                mode = keyword.value
        if mode is not None:
            text = _fold(mode)
            if text is None or set(text) & set("wax+"):
                self.found["file-write:open"] += 1
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        self._identifier(node.arg)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._identifier(node.arg)
        self.generic_visit(node)

    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._identifier(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_def

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        for name in node.names:
            self._identifier(name)

    visit_Nonlocal = visit_Global

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.expr):
            text = _fold(node)
            if text is not None:
                for construct in _string_constructs(text):
                    self.found[construct] += 1
        super().generic_visit(node)


_MODE = re.compile(r"[rwaxbtU+]{1,5}")


def constructs(source: bytes) -> Counter[str] | None:
    """The constructs of a module's source bytes, counted; None when Python would not compile it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError, OverflowError, RecursionError, MemoryError):
        return None
    try:
        found = _Scanner().scan(tree)
    except RecursionError:  # nesting deeper than any library needs: judged as not compiling
        return None
    declared = encoding_declaration(source)
    if declared is not None:
        found[f"encoding:{declared}"] += 1
    return found


def constructs_of_fragment(text: str) -> Counter[str]:
    """Constructs of lines whose module is unknown, word by word (strings and comments too)."""
    found: Counter[str] = Counter()
    text = _nfkc(text)
    for word in _WORD.findall(text):
        if word in INTERNAL_NAMES:
            found[f"word:{word}"] += 1
    for word in _FRAGMENT_BARE_WORD.findall(text):
        if word in _FRAGMENT_BARE:
            found[f"word:{word}"] += 1
    for names in _FRAGMENT_IMPORT.findall(text):
        for name in re.split(r"\s*,\s*", names):
            if name.split(".")[0] in FORBIDDEN_MODULES:
                found[f"module:{name.split('.')[0]}"] += 1
    for module, attr in _FRAGMENT_QUALIFIED.findall(text):
        if f"{module}.{attr}" in FORBIDDEN_QUALIFIED or _OS_FAMILIES.match(f"{module}.{attr}"):
            found[f"call:{module}.{attr}"] += 1
    for line in re.split(r"\r\n|\r|\n|\f|\v", text):
        if _DANGEROUS_PATH.search(line.replace("'", " ").replace('"', " ")) or "/proc" in line:
            found["path:/proc"] += 1
        if CODING.search(line.encode("utf-8", "surrogateescape")):
            found["encoding"] += 1
    return found


def grown(before: Counter[str], after: Counter[str]) -> list[str]:
    """The constructs `after` uses more often than `before`."""
    return sorted(key for key, count in after.items() if count > before.get(key, 0))


def new_constructs(base: str | None, new: str) -> str:
    """Why the patched module text `new` must not run (it does not compile, or uses a construct
    more often than `base`, None for a new file), or "" when it adds none."""
    new_bytes = new.encode("utf-8", "surrogateescape")
    after = constructs(new_bytes)
    if after is None:
        return "the patched module does not compile as Python"
    before = constructs(base.encode("utf-8", "surrogateescape")) if base else Counter()
    if before is None:  # the base did not compile: judge the whole new text as added
        before = Counter()
    base_encoding = encoding_declaration(base.encode("utf-8", "surrogateescape")) if base else None
    new_encoding = encoding_declaration(new_bytes)
    if new_encoding is not None and new_encoding != base_encoding:
        return f"declares a source encoding ({new_encoding}) the base module does not"
    more = grown(before, after)
    if more:
        return "reaches for dynamic execution or interpreter internals: " + ", ".join(more[:6])
    return ""


def new_constructs_in_fragments(old_lines: list[str], new_lines: list[str]) -> str:
    """`new_constructs` for hunks whose base text is unknown (word counts over the hunks)."""
    more = grown(constructs_of_fragment("\n".join(old_lines)), constructs_of_fragment("\n".join(new_lines)))
    if more:
        return "reaches for dynamic execution or interpreter internals: " + ", ".join(more[:6])
    return ""

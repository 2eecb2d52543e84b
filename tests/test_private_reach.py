# SPDX-License-Identifier: Apache-2.0
"""No module of the package touches another module's private state: an attribute access
`<obj>._name` (not a dunder) on anything but self/cls must name something its own module
defines (a class's `self._name`, a private function or class, a module global). What one
module needs of another's object goes through a public method or attribute, so a class's
private state can change without reading the rest of the package (doc/ on the house:
narrow dependencies, MessageStore the one composition root)."""
import ast
import re
import pathlib

import pytest

import rocketstore
from rocketstore import testing

PACKAGE = pathlib.Path(rocketstore.__file__).parent

# Reaches that cannot go through a public name, each with why.
ALLOWED = {
    # argparse has no public way to walk a parser's sub-commands (for `help <command>`).
    ("cli/command.py", "_actions"),
    ("cli/command.py", "_SubParsersAction"),
}


def _defined_names(tree):
    """The private names a module defines: self./cls. attributes it assigns, __slots__,
    functions, classes, and names bound at any level (module globals, class attributes)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            names.add(n.attr)
        elif isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets):
            names.update(c.value for c in ast.walk(n.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in n.names)
    return {x for x in names if x.startswith("_")}


def private_reaches(source, rel):
    tree = ast.parse(source)
    own = _defined_names(tree)
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or not n.attr.startswith("_"):
            continue
        if n.attr.startswith("__") and n.attr.endswith("__"):
            continue
        if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            continue
        if n.attr in own or (rel, n.attr) in ALLOWED:
            continue
        found.append(f"{rel}:{n.lineno}: {ast.unparse(n.value)}.{n.attr}")
    return found


def test_no_module_reaches_into_another_modules_private_state():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        found += private_reaches(path.read_text(encoding="utf-8"), rel)
    assert found == []


def test_the_private_reach_scan_catches_a_reach_into_another_modules_object():
    # The scan itself: a reach into an object of another module is reported; the same
    # name defined by the module, self/cls and dunders are not.
    src = ("def f(store, m):\n"
           "    store._loaded\n"
           "    m._mine\n"
           "    store.__class__\n"
           "class A:\n"
           "    def __init__(self):\n"
           "        self._mine = 1\n")
    assert private_reaches(src, "x.py") == ["x.py:2: store._loaded"]


def test_the_compiled_read_path_reads_only_the_stores_public_names():
    # Cython is not Python's AST: the .pxi entries get the MessageStore as `store`, and
    # read what they need of it by public name (a public attribute costs the same).
    pyx = pathlib.Path(__file__).resolve().parent.parent / "pyx"
    if not pyx.is_dir():
        pytest.skip("no source tree beside the tests (an installed-wheel run)")
    sources = sorted(pyx.glob("*.p*"))
    assert sources, "the source tree has its pyx sources"
    found = [f"{p.name}:{i}: {line.strip()}" for p in sources
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bstore\._(?!_)\w", line)]
    assert found == []



def _lent_slots():
    """Every name a class of the package lends the compiled layer (its LENT_SLOTS)."""
    lent = set()
    for path in PACKAGE.rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "LENT_SLOTS" for t in n.targets):
                lent.update(ast.literal_eval(n.value))
    return lent


def test_the_compiled_layer_reads_only_the_private_slots_their_classes_lend():
    # The .pxi entries read and write __slots__ members at their descriptors' offsets, named
    # in `_*_SLOTS` tuples. A private one must be lent by its class (LENT_SLOTS), so the
    # class says itself which of its private state the compiled layer takes part in;
    # _member_offsets refuses any other at run time.
    pyx = pathlib.Path(__file__).resolve().parent.parent / "pyx"
    if not pyx.is_dir():
        pytest.skip("no source tree beside the tests (an installed-wheel run)")
    tables = [(p.name, m.group(1), m.group(2)) for p in sorted(pyx.glob("*.p*"))
              for m in re.finditer(r"^(_\w*SLOTS) = \(([^)]*)\)",
                                   p.read_text(encoding="utf-8"), re.M)]
    assert tables, "the pyx sources name the slots they read"
    private = {(f, t, name) for f, t, body in tables
               for name in re.findall(r'"(_[^_"][^"]*)"', body)}
    assert private, "the compiled layer reads some private slots (lent ones)"
    lent = _lent_slots()
    assert sorted(x for x in private if x[2] not in lent) == []


def test_the_compiled_layer_refuses_a_private_slot_its_class_does_not_lend():
    from rocketstore.message import MessageExt
    cext = testing.load_backend("cext")

    class NotLent:          # MappedFile's members, with no LENT_SLOTS
        __slots__ = ("file_from_offset", "committed_position", "mm", "_lock", "_available",
                     "_refs", "_cond")
    with pytest.raises(TypeError, match="NotLent._lock is private"):
        cext.ReadPath(MessageExt, NotLent, None)

# ---- no module takes the whole store ------------------------------------------------------------
# MessageStore is the one composition root: it builds its collaborators and hands each the few
# objects it uses. Only outer layers may hold a store: the command line (cli/), and the
# consumers store.py hands out, which use the store's public interface alone (checked below).
MAY_HOLD_A_STORE = ("store.py", "consumer.py", "cli/")


def takes_the_store(source, rel):
    """Where a module's class takes a `store` constructor parameter or keeps a store in
    self.store / self._store."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.FunctionDef) and n.name == "__init__":
            params = n.args.posonlyargs + n.args.args + n.args.kwonlyargs
            if any(a.arg == "store" for a in params):
                found.append((n.lineno, "__init__ takes store"))
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) \
                and n.attr in ("store", "_store") \
                and isinstance(n.value, ast.Name) and n.value.id == "self":
            found.append((n.lineno, f"self.{n.attr} ="))
    return [f"{rel}:{line}: {what}" for line, what in sorted(found)]


def functions_taking_the_store(source, rel):
    """Where a module-level function takes a parameter named `store`: the function reaches
    into whatever it likes of the store, where its collaborators should be handed in."""
    return [f"{rel}:{n.lineno}: {n.name}(store)" for n in ast.parse(source).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(a.arg == "store" for a in
                    n.args.posonlyargs + n.args.args + n.args.kwonlyargs)]


# Modules whose functions take a MessageStore as any user of the package would, through the
# names store.pyi declares alone (checked below), so they may take one: the load generator
# and read-back checks, the metrics exporter, and the test helpers.
PUBLIC_API_USERS = ("workload.py", "stats.py", "testing.py")


def test_no_module_level_function_but_the_public_api_users_takes_the_whole_store():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(MAY_HOLD_A_STORE) or rel in PUBLIC_API_USERS:
            continue
        found += functions_taking_the_store(path.read_text(encoding="utf-8"), rel)
    assert found == []


def test_the_function_scan_catches_a_module_level_function_that_takes_the_store():
    src = ("def f(store, topic):\n"
           "    return store.commitlog\n"
           "def g(commitlog, *, store=None):\n"
           "    pass\n"
           "def h(commitlog, kernels):\n"
           "    def inner(store):\n"           # nested: its module function is h
           "        pass\n"
           "class A:\n"
           "    def m(self, store):\n"         # a method: the class test's business
           "        pass\n")
    assert functions_taking_the_store(src, "x.py") == ["x.py:1: f(store)", "x.py:3: g(store)"]


def test_no_module_but_the_composition_root_and_outer_layers_takes_the_whole_store():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(MAY_HOLD_A_STORE):
            continue
        found += takes_the_store(path.read_text(encoding="utf-8"), rel)
    assert found == []


def test_the_store_scan_catches_a_class_that_takes_the_store():
    src = ("class A:\n"
           "    def __init__(self, store):\n"
           "        self._store = store\n"
           "class B:\n"
           "    def __init__(self, *, store=None):\n"
           "        self.store = store\n"
           "class C:\n"
           "    def __init__(self, commitlog):\n"
           "        self.commitlog = commitlog\n")
    assert takes_the_store(src, "x.py") == [
        "x.py:2: __init__ takes store", "x.py:3: self._store =",
        "x.py:5: __init__ takes store", "x.py:6: self.store ="]


def _stub_members(stub, cls):
    """The names a class of a .pyi stub declares (its public interface)."""
    tree = ast.parse(stub)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    names = set()
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return names


def store_names_used(source):
    """The attribute names a module reads of a `store` (a parameter or local of that name,
    or self.store)."""
    used = set()
    for n in ast.walk(ast.parse(source)):
        if not isinstance(n, ast.Attribute):
            continue
        v = n.value
        if (isinstance(v, ast.Name) and v.id == "store") or (
                isinstance(v, ast.Attribute) and v.attr == "store"
                and isinstance(v.value, ast.Name) and v.value.id == "self"):
            used.add(n.attr)
    return used


@pytest.mark.parametrize("module", ("consumer.py",) + PUBLIC_API_USERS)
def test_the_public_api_users_use_only_the_stores_public_interface(module):
    # consumer.py's cursors keep the store they read from, and the functions of the public
    # API users take one: allowed because every name they use of it is one store.pyi
    # declares (what any user of the package may call).
    public = _stub_members((PACKAGE / "store.pyi").read_text(encoding="utf-8"), "MessageStore")
    used = store_names_used((PACKAGE / module).read_text(encoding="utf-8"))
    assert used, f"{module} reads its store"
    assert sorted(used - public) == []

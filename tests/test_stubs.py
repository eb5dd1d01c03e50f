"""The hand-written stub ``dspark/_native.pyi`` against the compiled extension ``dspark._native``.

Everything the extension exposes must be in the stub and everything in the stub must exist:
module functions, classes (with their bases), methods, static and class methods, properties
and attributes, and the typing-relevant dunders (``__len__``...). Where the extension gives a
``__text_signature__``, each function's parameters must match the stub's by name, kind
(positional, keyword-only, ``*args``, ``**kwargs``) and whether they have a default. Names that
only exist for the type checker (type aliases, ``TypedDict``\\ s) are stub-only by design.

A native member added, renamed or re-signatured without its stub fails here.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import dspark
import dspark._native as native
from helpers import HAS_TEST_HOOKS

STUB = Path(dspark.__file__).parent / "_native.pyi"

#: Dunders that change what a type checker allows (``len(x)``, ``x[i]``, ``with x``...): the
#: stub must declare them when the extension has them. Other dunders (``__repr__``, ``__new__``,
#: ``__doc__``...) exist on every object and say nothing to a type checker.
TYPING_DUNDERS = {
    "__len__",
    "__iter__",
    "__next__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__call__",
    "__enter__",
    "__exit__",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
}

#: ``(name, kind, has default)`` of every parameter but ``self`` / ``cls``.
Params = list[tuple[str, str, bool]]

T = TypeVar("T")


@dataclass
class StubClass:
    """A class of the stub: its bases, member kinds and method parameters."""

    bases: list[str]
    members: dict[str, str] = field(default_factory=dict)
    params: dict[str, Params] = field(default_factory=dict)


@dataclass
class Stub:
    """What the stub declares at module level."""

    functions: dict[str, Params] = field(default_factory=dict)
    classes: dict[str, StubClass] = field(default_factory=dict)
    values: set[str] = field(default_factory=set)


def _kind_name(kind: inspect._ParameterKind) -> str:
    return {
        inspect.Parameter.POSITIONAL_ONLY: "positional-only",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "*args",
        inspect.Parameter.KEYWORD_ONLY: "keyword-only",
        inspect.Parameter.VAR_KEYWORD: "**kwargs",
    }[kind]


def _stub_params(fn: ast.FunctionDef, *, bound: bool) -> Params:
    """A stub function's parameters, without ``self`` / ``cls`` when ``bound``."""
    a = fn.args
    positional = [(p, "positional-only") for p in a.posonlyargs]
    positional += [(p, "positional") for p in a.args]
    first_default = len(positional) - len(a.defaults)
    out: Params = [(p.arg, kind, i >= first_default) for i, (p, kind) in enumerate(positional)]
    if bound and out:
        out = out[1:]
    if a.vararg is not None:
        out.append((a.vararg.arg, "*args", False))
    out += [
        (p.arg, "keyword-only", d is not None)
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    if a.kwarg is not None:
        out.append((a.kwarg.arg, "**kwargs", False))
    return out


def _decorators(fn: ast.FunctionDef) -> set[str]:
    names = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            names.add(d.id)
        elif isinstance(d, ast.Attribute):
            names.add(d.attr)
    return names


def _is_type_alias(node: ast.AnnAssign) -> bool:
    ann = node.annotation
    return (isinstance(ann, ast.Name) and ann.id == "TypeAlias") or (
        isinstance(ann, ast.Attribute) and ann.attr == "TypeAlias"
    )


def read_stub() -> Stub:
    """Parse the stub (type aliases and ``X = TypedDict(...)`` assignments are stub-only)."""
    stub = Stub()
    for node in ast.parse(STUB.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            stub.functions[node.name] = _stub_params(node, bound=False)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if not _is_type_alias(node):
                stub.values.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            cls = StubClass(bases=[ast.unparse(b) for b in node.bases])
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    decorators = _decorators(item)
                    if "property" in decorators or "setter" in decorators:
                        cls.members[item.name] = "attribute"
                    elif "staticmethod" in decorators:
                        cls.members[item.name] = "staticmethod"
                        cls.params[item.name] = _stub_params(item, bound=False)
                    elif "classmethod" in decorators:
                        cls.members[item.name] = "classmethod"
                        cls.params[item.name] = _stub_params(item, bound=True)
                    else:
                        cls.members[item.name] = "method"
                        cls.params[item.name] = _stub_params(item, bound=True)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    cls.members[item.target.id] = "attribute"
            stub.classes[node.name] = cls
    return stub


def runtime_params(obj: object, *, bound: bool) -> Params | None:
    """The parameters ``__text_signature__`` gives, or ``None`` where there is none."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if bound and params and params[0].name in ("self", "cls", "$self", "$cls"):
        params = params[1:]
    return [(p.name, _kind_name(p.kind), p.default is not inspect.Parameter.empty) for p in params]


def runtime_members(cls: type) -> dict[str, str]:
    """Kind of every member the extension class defines itself."""
    out = {}
    for name, raw in vars(cls).items():
        if name.startswith("__") and name not in TYPING_DUNDERS:
            continue
        if isinstance(raw, staticmethod):
            out[name] = "staticmethod"
        elif isinstance(raw, classmethod) or type(raw).__name__ == "classmethod_descriptor":
            out[name] = "classmethod"
        elif inspect.isgetsetdescriptor(raw) or inspect.ismemberdescriptor(raw):
            out[name] = "attribute"
        elif isinstance(raw, property):
            out[name] = "attribute"
        elif callable(raw):
            # A plain function in a class dict is a static method once bound: PyO3 stores
            # #[staticmethod]s as builtin functions.
            out[name] = "staticmethod" if inspect.isbuiltin(raw) else "method"
        else:
            out[name] = "attribute"
    return out


def runtime_names() -> dict[str, object]:
    """Every name the extension module exposes (dunders aside, ``__version__`` included)."""
    names = {n: getattr(native, n) for n in dir(native) if not n.startswith("__")}
    names["__version__"] = native.__version__
    return names


def _is_extension_class(value: object) -> bool:
    return isinstance(value, type)


def test_py_typed_and_stubs_match_runtime() -> None:
    pkg = Path(dspark.__file__).parent
    assert (pkg / "py.typed").exists()
    tree = ast.parse((pkg / "_native.pyi").read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)} | {
        t.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        # Type aliases (`_Tensor: TypeAlias = Any`) exist in the stub only.
        and not (isinstance(n.annotation, ast.Name) and n.annotation.id == "TypeAlias")
        for t in [n.target]
        if isinstance(t, ast.Name)
    }
    public = {n for n in dir(native) if not n.startswith("_")}
    assert {n for n in stubbed if not n.startswith("_")} == public
    # Test hooks and the version are stubbed too, and every stubbed name exists at run time
    # (the hooks only in a wheel built with them).
    hooks = {"_dlpack_describe", "_dlpack_sum", "_test_panic"}
    assert all(hasattr(native, n) for n in stubbed if HAS_TEST_HOOKS or n not in hooks)


def test_every_module_name_is_stubbed_as_what_it_is() -> None:
    stub = read_stub()
    problems = []
    for name, value in sorted(runtime_names().items()):
        if _is_extension_class(value):
            want, where = "class", stub.classes
        elif callable(value):
            want, where = "function", stub.functions
        else:
            want, where = "value", stub.values
        if name not in where:
            problems.append(f"{name}: a {want} of the extension, not in the stub as one")
    runtime = runtime_names()
    for name in sorted({*stub.functions, *stub.classes, *stub.values}):
        if name not in runtime:
            problems.append(f"{name}: in the stub, not in the extension")
    assert not problems, "\n".join(problems)


def _with_runtime(entries: dict[str, T]) -> Iterator[tuple[str, T, object]]:
    """``(name, stub entry, the extension's object of that name or None)``, by name."""
    for name, entry in sorted(entries.items()):
        yield name, entry, getattr(native, name, None)


def test_module_function_signatures_match() -> None:
    problems = []
    for name, params, value in _with_runtime(read_stub().functions):
        if value is None:
            continue  # reported by the name test
        got = runtime_params(value, bound=False)
        if got is not None and got != params:
            problems.append(f"{name}: extension {got}\n{' ' * len(name)}  stub      {params}")
    assert not problems, "\n".join(problems)


def test_class_bases_match() -> None:
    problems = []
    for name, cls, value in _with_runtime(read_stub().classes):
        if not isinstance(value, type):
            continue
        got = [b.__name__ for b in value.__bases__ if b is not object]
        if got != [b for b in cls.bases if b != "object"]:
            problems.append(f"{name}: extension bases {got}, stub {cls.bases}")
    assert not problems, "\n".join(problems)


def test_class_members_and_their_signatures_match() -> None:
    problems = []
    for name, cls, value in _with_runtime(read_stub().classes):
        if not isinstance(value, type) or issubclass(value, BaseException):
            # Exceptions: their attributes (.code, .problems) are set per instance.
            continue
        members = runtime_members(value)
        stub_members = {m: k for m, k in cls.members.items() if m != "__init__"}
        for member in sorted(set(members) | set(stub_members)):
            got, want = members.get(member), stub_members.get(member)
            if got != want:
                problems.append(f"{name}.{member}: extension {got}, stub {want}")
            elif member in cls.params:
                bound = got != "staticmethod"
                params = runtime_params(getattr(value, member), bound=bound)
                if params is not None and params != cls.params[member]:
                    problems.append(
                        f"{name}.{member}: extension {params}\n    stub {cls.params[member]}"
                    )
        # The constructor: the class's own text signature against the stub's __init__.
        has_ctor = getattr(value, "__text_signature__", None) is not None
        ctor = runtime_params(value, bound=False) if has_ctor else None
        if "__init__" in cls.params:
            if ctor is None:
                problems.append(f"{name}.__init__: in the stub, the extension has no constructor")
            elif ctor != cls.params["__init__"]:
                problems.append(
                    f"{name}.__init__: extension {ctor}\n    stub {cls.params['__init__']}"
                )
        elif ctor is not None:
            problems.append(f"{name}: the extension has a constructor {ctor}, the stub none")
    assert not problems, "\n".join(problems)

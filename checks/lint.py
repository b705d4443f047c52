"""Hot-path lint: a static (ast) scan of per-step functions for host reads of device data.

``runnercheck lint [PATHS...]`` (default: the installed ``impl`` package) prints one
``file:line: rule: message`` per finding and exits 1 when there are findings, 0 when clean.

Which functions are hot
-----------------------
Functions decorated with `runnercheck.impl.hotpath.hot_path` (``@hot_path`` or ``@<module>.hot_path``), and
functions whose name is in `HOT_PATH` (``execute_model``: a runner's step entry point is hot even
if someone forgets the decorator).  Everything lexically inside a hot function is scanned,
including nested functions and lambdas: an enqueued closure runs on the host on CUDA, so a host
read there syncs just the same.  Hotness does not follow calls: decorate every per-step function.

Rules
-----
``host-read``   ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.to("cpu")``, and
                ``np.asarray``/``np.array`` of a tensor.  The method names are flagged whatever the
                receiver (``numpy_array.tolist()`` in a hot function is flagged too: convert host
                data outside the hot path or suppress with a reason).
``host-sync``   any ``synchronize(...)`` call (``torch.cuda.synchronize``, event, stream, device).
``tensor-cond`` a tensor used where Python needs a host value: the test of ``if``/``while``/
                ``assert``/a conditional expression/a comprehension ``if``, or the argument of
                ``bool()``/``int()``/``float()``/``range()``.

The tensor heuristic (flow-insensitive, per hot function; kept narrow to keep false positives
low) calls an expression *tensor-valued* when it is

* a call of a ``torch.*`` function, except host-only ones (``torch.is_tensor`` and the other
  ``torch.is_*`` predicates but ``is_nonzero``, ``torch.cuda.*``, ``torch.backends.*``,
  ``torch.jit.*``, ``torch.compiler.*``, ``torch.device``/``dtype``/``Size``/``finfo``/``iinfo``,
  ``torch.get_*``/``torch.are_*``);
* a name assigned (anywhere in the function) from a tensor-valued expression, a parameter annotated
  ``Tensor``, or a name/attribute ending in ``_t``, ``_tensor``, ``_gpu`` or ``_cuda``;
* arithmetic, comparison (other than ``is``/``is not``), indexing or a method call on a
  tensor-valued expression, except metadata that lives on the host: ``.shape``, ``.dtype``,
  ``.device``, ``.ndim``, ``.is_cuda``, ``.numel()``, ``.dim()``, ``.size()``, ``.stride()`` ...
  and ``len()``.

Suppression: a comment ``# runnercheck: allow-host-read <reason>`` on any line of the flagged
expression.  The reason is required; a bare marker is itself a finding (``suppression``).
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

HOT_PATH: tuple[str, ...] = ("execute_model",)
HOT_DECORATOR = "hot_path"

HOST_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
TENSOR_SUFFIXES = ("_t", "_tensor", "_gpu", "_cuda")
METADATA_ATTRS = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "layout", "requires_grad", "is_leaf",
    "itemsize", "nbytes", "names", "is_sparse", "is_quantized", "is_meta",
})
METADATA_METHODS = frozenset({
    "numel", "nelement", "dim", "ndimension", "size", "stride", "element_size", "data_ptr",
    "is_contiguous", "is_pinned", "is_floating_point", "is_complex", "storage_offset",
    "untyped_storage", "get_device", "type", "item", "tolist", "numpy",
})
HOST_TORCH_NAMESPACES = frozenset({"cuda", "backends", "jit", "compiler", "distributed", "testing", "utils", "overrides"})
HOST_TORCH_FUNCTIONS = frozenset({"device", "dtype", "Size", "finfo", "iinfo", "Generator", "no_grad", "inference_mode",
                                  "enable_grad", "manual_seed", "set_grad_enabled", "typename", "result_type",
                                  "promote_types", "can_cast", "broadcast_shapes"})
CONDITION_BUILTINS = frozenset({"bool", "int", "float", "range", "complex"})
SUPPRESS_RE = re.compile(r"#\s*runnercheck:\s*allow-host-read\b(.*)")


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str
    function: str

    def format(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message} (in {self.function})"


# --------------------------------------------------------------------------- tensor heuristic


def _torch_chain(node: ast.AST) -> list[str] | None:
    """``torch.a.b`` -> ``["a", "b"]``; None when the expression is not rooted at ``torch``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch" and parts:
        return parts[::-1]
    return None


def _is_tensor_producing_torch_call(call: ast.Call) -> bool:
    chain = _torch_chain(call.func)
    if chain is None:
        return False
    head, last = chain[0], chain[-1]
    if head in HOST_TORCH_NAMESPACES or head in HOST_TORCH_FUNCTIONS:
        return False
    if last.startswith("is_") and last != "is_nonzero":
        return False
    return not last.startswith(("get_", "are_"))


def _has_tensor_suffix(name: str) -> bool:
    return name.endswith(TENSOR_SUFFIXES)


class _TensorNames:
    """Names the heuristic treats as tensors inside one hot function (see the module docstring)."""

    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef):
        self.names: set[str] = set()
        args = func.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if arg.annotation is not None and "Tensor" in ast.unparse(arg.annotation):
                self.names.add(arg.arg)
        bindings = [(n.targets, n.value) for n in ast.walk(func) if isinstance(n, ast.Assign)]
        bindings += [([n.target], n.value) for n in ast.walk(func) if isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value]
        bindings += [([n.target], n.iter) for n in ast.walk(func) if isinstance(n, (ast.For, ast.AsyncFor))]
        bindings += [([n.target], n.value) for n in ast.walk(func) if isinstance(n, ast.NamedExpr)]
        for _ in range(8):  # fixpoint over chains like y = x + 1; z = y * 2
            before = len(self.names)
            for targets, value in bindings:
                if self.is_tensor(value):
                    for target in targets:
                        self.names.update(_bound_names(target))
            if len(self.names) == before:
                break

    def is_tensor(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names or _has_tensor_suffix(node.id)
        if isinstance(node, ast.Attribute):
            if node.attr in METADATA_ATTRS:
                return False
            return _has_tensor_suffix(node.attr) or self.is_tensor(node.value)
        if isinstance(node, ast.Call):
            if _is_tensor_producing_torch_call(node):
                return True
            func = node.func
            return isinstance(func, ast.Attribute) and func.attr not in METADATA_METHODS and self.is_tensor(func.value)
        if isinstance(node, ast.BinOp):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            return self.is_tensor(node.operand)
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                return False
            return any(self.is_tensor(x) for x in (node.left, *node.comparators))
        if isinstance(node, ast.IfExp):
            return self.is_tensor(node.body) or self.is_tensor(node.orelse)
        return False

    def condition_reads(self, test: ast.AST) -> bool:
        """Whether evaluating ``test`` for truth converts a tensor to a host bool."""
        if isinstance(test, ast.BoolOp):
            return any(self.condition_reads(v) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.condition_reads(test.operand)
        return self.is_tensor(test)


def _bound_names(target: ast.AST) -> Iterable[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


# --------------------------------------------------------------------------- scanning


def _is_hot(func: ast.FunctionDef | ast.AsyncFunctionDef, hot_names: Sequence[str]) -> bool:
    if func.name in hot_names:
        return True
    for deco in func.decorator_list:
        if isinstance(deco, ast.Name) and deco.id == HOT_DECORATOR:
            return True
        if isinstance(deco, ast.Attribute) and deco.attr == HOT_DECORATOR:
            return True
    return False


def hot_functions(tree: ast.AST, hot_names: Sequence[str] = HOT_PATH) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualified name, node)`` of every hot function in ``tree``, outermost first."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = f"{prefix}{child.name}"
                if _is_hot(child, hot_names):
                    found.append((qualname, child))
                visit(child, f"{qualname}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _src(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _walk_with_function(func: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> Iterable[tuple[ast.AST, str]]:
    """Every node under ``func`` with the qualified name of the innermost function holding it."""
    stack: list[tuple[ast.AST, str]] = [(func, qualname)]
    while stack:
        node, name = stack.pop()
        yield node, name
        for child in ast.iter_child_nodes(node):
            inner = f"{name}.<locals>.{child.name}" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            stack.append((child, inner))


def _findings_in(func: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> list[tuple[ast.AST, str, str, str]]:
    tensors = _TensorNames(func)
    out: list[tuple[ast.AST, str, str, str]] = []
    for node, where in _walk_with_function(func, qualname):
        start = len(out)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in HOST_READ_METHODS:
                out.append((node, "host-read", f"`.{f.attr}()` copies device data to the host and waits for it"))
            elif isinstance(f, ast.Attribute) and f.attr == "to" and _targets_cpu(node):
                out.append((node, "host-read", "`.to(\"cpu\")` copies device data to the host and waits for it"))
            elif (isinstance(f, ast.Attribute) and f.attr == "synchronize") or (isinstance(f, ast.Name) and f.id == "synchronize"):
                out.append((node, "host-sync", f"`{_src(f)}()` makes the host wait for the device"))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("np", "numpy") \
                    and f.attr in ("asarray", "array") and node.args and tensors.is_tensor(node.args[0]):
                out.append((node, "host-read", f"`{_src(node)}` converts a tensor to a host array"))
            elif isinstance(f, ast.Name) and f.id in CONDITION_BUILTINS and node.args and tensors.is_tensor(node.args[0]):
                out.append((node, "tensor-cond", f"`{_src(node)}` reads a tensor on the host"))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) and tensors.condition_reads(node.test):
            out.append((node.test, "tensor-cond", f"tensor used as a condition (`{_src(node.test)}`): its truth value is read on the host"))
        elif isinstance(node, ast.comprehension):
            for cond in node.ifs:
                if tensors.condition_reads(cond):
                    out.append((cond, "tensor-cond", f"tensor used as a condition (`{_src(cond)}`): its truth value is read on the host"))
        out[start:] = [(*found, where) for found in out[start:]]
    return out


def _targets_cpu(call: ast.Call) -> bool:
    values = [*call.args, *(kw.value for kw in call.keywords if kw.arg == "device")]
    for v in values:
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.split(":")[0] == "cpu":
            return True
        if isinstance(v, ast.Call) and _torch_chain(v.func) == ["device"] and v.args and \
                isinstance(v.args[0], ast.Constant) and v.args[0].value == "cpu":
            return True
    return False


def _suppressions(source: str) -> dict[int, tuple[str, int]]:
    """Line -> (reason, column) of every ``# runnercheck: allow-host-read`` comment (reason may be empty)."""
    found: dict[int, tuple[str, int]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            m = SUPPRESS_RE.search(tok.string)
            if m:
                found[tok.start[0]] = (m.group(1).strip(), tok.start[1])
    return found


def lint_source(source: str, path: str = "<string>", hot_names: Sequence[str] = HOT_PATH) -> list[Finding]:
    """Findings for one module's source (raises SyntaxError for unparsable source)."""
    tree = ast.parse(source, filename=path)
    suppress = _suppressions(source)
    findings: dict[tuple[int, int, str], Finding] = {}
    for line, (reason, col) in suppress.items():
        if not reason:
            findings[(line, col, "suppression")] = Finding(
                path, line, col, "suppression", "`runnercheck: allow-host-read` needs a reason after it", "<module>")
    for qualname, func in hot_functions(tree, hot_names):
        for node, rule, message, where in _findings_in(func, qualname):
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if any(suppress.get(line, ("", 0))[0] for line in lines):
                continue
            # a hot function nested in a hot function is scanned twice; both scans name it alike
            findings[(node.lineno, node.col_offset, rule)] = Finding(path, node.lineno, node.col_offset, rule, message, where)
    return sorted(findings.values())


def python_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(f for f in sorted(p.rglob("*.py")) if "__pycache__" not in f.parts)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return files


def lint_paths(paths: Iterable[str | Path], hot_names: Sequence[str] = HOT_PATH) -> list[Finding]:
    findings: list[Finding] = []
    for f in python_files(paths):
        findings.extend(lint_source(f.read_text(encoding="utf-8"), str(f), hot_names))
    return findings


def default_paths() -> list[str]:
    """The installed ``impl`` package directory."""
    spec = importlib.util.find_spec("runnercheck.impl")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("runnercheck.impl is not installed; pass PATHS")
    return [list(spec.submodule_search_locations)[0]]


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", help="files or directories to scan (default: the installed impl package)")
    parser.add_argument("--hot", action="append", default=[], metavar="NAME",
                        help=f"also treat functions with this name as hot (always: {', '.join(HOT_PATH)})")
    parser.add_argument("--list-hot", action="store_true", help="list the hot functions found, then lint")


def run(args: argparse.Namespace) -> int:
    hot_names = (*HOT_PATH, *args.hot)
    try:
        paths = args.paths or default_paths()
        files = python_files(paths)
    except FileNotFoundError as e:
        print(f"runnercheck lint: {e}", file=sys.stderr)
        return 2
    findings: list[Finding] = []
    num_hot = 0
    for f in files:
        source = f.read_text(encoding="utf-8")
        try:
            tree = ast.parse(source, filename=str(f))
        except SyntaxError as e:
            print(f"{f}:{e.lineno}: syntax-error: {e.msg}")
            findings.append(Finding(str(f), e.lineno or 0, 0, "syntax-error", e.msg, "<module>"))
            continue
        hot = hot_functions(tree, hot_names)
        num_hot += len(hot)
        if args.list_hot:
            for qualname, node in hot:
                print(f"{f}:{node.lineno}: hot: {qualname}")
        for finding in lint_source(source, str(f), hot_names):
            print(finding.format())
            findings.append(finding)
    status = f"{len(findings)} finding(s)" if findings else "clean"
    print(f"runnercheck lint: {status}; {num_hot} hot function(s) in {len(files)} file(s)", file=sys.stderr)
    return 1 if findings else 0

"""The package's shape: no import circle, imports downhill only, modules and functions kept short.

Read from the source (every import, at module level or inside a function), so a circle or an
upward import cannot hide behind a lazy import.
"""
import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from helpers import REPO

PACKAGE = REPO / 'mmrobust'
#: the subpackages from the lowest layer up: a module imports from its own layer or lower ones
LAYERS = (('version', 'registry'), ('utils', ), ('corruptions', ), ('datasets', 'models'),
          ('engine', ), ('evaluation', ), ('apis', ), ('analysis', ))
#: the evaluation house's rule for a module (CONTRIBUTING.md)
MAX_EVALUATION_MODULE_LINES = 500
MAX_FUNCTION_LINES = 90


def _modules() -> Dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = list(path.relative_to(REPO).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts.pop()
        out['.'.join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The mmrobust modules ``name`` imports (a name imported from a package: its submodule)."""
    package = path.name == '__init__.py'
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split('.') if package else name.split('.')[:-1]
                base = base[:len(base) - node.level + 1]
                target = '.'.join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            for alias in node.names:
                sub = f'{target}.{alias.name}'
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work: List[Tuple[str, List[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_circles_are_found():
    assert _circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert _circles({'a': {'b'}, 'b': set()}) == []


def test_no_import_circle():
    graph = _graph()
    circles = _circles(graph)
    assert not circles, '\n'.join(
        ' <-> '.join(c) + ': ' + '; '.join(f'{m} imports {sorted(graph[m] & set(c))}' for m in c)
        for c in circles)


def test_imports_go_downhill_only():
    layer = {name: k for k, names in enumerate(LAYERS) for name in names}
    graph = _graph()
    subpackages = {name.split('.')[1] for name in graph if name.count('.')}
    assert subpackages <= set(layer), f'place {subpackages - set(layer)} in LAYERS'
    upward = sorted(
        f'{name} -> {target}' for name, targets in graph.items() if name.count('.')
        for target in targets if target.count('.')
        and layer[target.split('.')[1]] > layer[name.split('.')[1]])
    assert not upward, upward
    # the root package imports them all (it registers every module); nothing imports it
    assert not [n for n, targets in graph.items() if 'mmrobust' in targets]


@pytest.mark.parametrize('path', sorted((PACKAGE / 'evaluation').rglob('*.py')),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_evaluation_modules_stay_readable(path):
    lines = path.read_text().count('\n')
    assert lines <= MAX_EVALUATION_MODULE_LINES, f'{path.name}: {lines} lines'


def test_no_function_over_its_limit():
    long = []
    for path in sorted(PACKAGE.rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f'{path.relative_to(REPO)}:{node.lineno} {node.name} ({size})')
    assert not long, long

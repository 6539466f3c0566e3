"""Rooms of one concern: the functions longer than ``MAX_FUNCTION_LINES`` and the files longer than
``MAX_FILE_LINES`` in the library, and the string-keyed dicts of Any it still annotates.

    python -m modelupgrade.tools.code_size            # the lists, longest first
    python -m modelupgrade.tools.code_size --check    # the same; exit 1 if any is over

A function's length runs from its ``def`` line to its last line (a method's too; a nested
function counts inside its parent and on its own).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "modelupgrade"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600


@dataclass(frozen=True)
class Sized:
    """A function (``name`` set) or a file, and its length in lines."""

    path: Path
    lines: int
    name: str = ""
    line: int = 0

    def describe(self, root: Path) -> str:
        where = self.path.relative_to(root).as_posix()
        if self.name:
            return f"{where}:{self.line} {self.name}: {self.lines} lines"
        return f"{where}: {self.lines} lines"


def functions(path: Path) -> Iterator[Sized]:
    """Every function and method of the file at ``path``, with its length."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            yield Sized(path, end - node.lineno + 1, node.name, node.lineno)


def long_functions(package: Path = LIBRARY, limit: int = MAX_FUNCTION_LINES) -> list[Sized]:
    found = [f for path in sorted(package.rglob("*.py")) for f in functions(path)]
    return sorted((f for f in found if f.lines > limit), key=lambda f: -f.lines)


def long_files(package: Path = LIBRARY, limit: int = MAX_FILE_LINES) -> list[Sized]:
    sizes = (
        Sized(path, len(path.read_text(encoding="utf-8").splitlines()))
        for path in sorted(package.rglob("*.py"))
    )
    return sorted((s for s in sizes if s.lines > limit), key=lambda s: -s.lines)


def _is_dict_str_any(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "dict"
        and isinstance(node.slice, ast.Tuple)
        and [getattr(e, "id", None) for e in node.slice.elts] == ["str", "Any"]
    )


def dict_str_any(package: Path = LIBRARY) -> dict[Path, int]:
    """How many annotations (or casts) of a dict from str to Any each file of ``package`` has,
    files with none left out."""
    counts = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found = sum(1 for node in ast.walk(tree) if _is_dict_str_any(node))
        if found:
            counts[path] = found
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if anything is over")
    args = parser.parse_args(argv)
    functions_over, files_over = long_functions(), long_files()
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(functions_over)}")
    print("\n".join(f"  {f.describe(ROOT)}" for f in functions_over))
    print(f"files over {MAX_FILE_LINES} lines: {len(files_over)}")
    print("\n".join(f"  {f.describe(ROOT)}" for f in files_over))
    counts = dict_str_any()
    print(f"dict[str, Any] annotations: {sum(counts.values())}")
    for path, n in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"  {path.relative_to(ROOT).as_posix()}: {n}")
    return 1 if args.check and (functions_over or files_over) else 0


if __name__ == "__main__":
    sys.exit(main())

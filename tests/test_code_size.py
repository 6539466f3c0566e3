"""The code-size report (``modelupgrade.tools.code_size``) on files whose answer is known.

The library's own figures are reported, not enforced yet:
``python -m modelupgrade.tools.code_size``.
"""

from __future__ import annotations

from pathlib import Path

from modelupgrade.tools.code_size import dict_str_any, long_files, long_functions


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_functions_and_files_over_their_limits_are_listed_longest_first(tmp_path: Path) -> None:
    body = "    x = 1\n"
    write(tmp_path / "pkg/a.py", "def short():\n" + body * 3 + "\n\ndef long():\n" + body * 9)
    write(
        tmp_path / "pkg/sub/b.py",
        "class C:\n    def method(self):\n" + "        y = 2\n" * 11 + "\n" * 5,
    )
    assert [(f.name, f.lines) for f in long_functions(tmp_path / "pkg", limit=8)] == [
        ("method", 12),
        ("long", 10),
    ]
    assert [(f.path.name, f.lines) for f in long_files(tmp_path / "pkg", limit=15)] == [
        ("b.py", 18),
        ("a.py", 16),
    ]


def test_dict_str_any_annotations_are_counted_per_file(tmp_path: Path) -> None:
    write(tmp_path / "pkg/a.py", "def f(x: dict[str, Any]) -> dict[str, Any]:\n    return x\n")
    write(tmp_path / "pkg/b.py", "def g(x: dict[str, int]) -> None: ...\n")
    assert dict_str_any(tmp_path / "pkg") == {tmp_path / "pkg/a.py": 2}

"""The architecture holds: stages import downward only, one home per metric formula, deferred imports say why."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmplay"
README = (ROOT / "README.md").read_text()

# A request record's timestamps (and the short local names code gives them): their differences are
# latencies, and computing those is metrics.py's job alone. (sent - scheduled is the load generator's check on its
# own schedule, not a latency of the engine, so it stays with the load generator.)
_TIMESTAMP_FIELDS = {
    "sent_ns",
    "first_chunk_ns",
    "first_content_ns",
    "first_text_ns",
    "end_ns",
    "chunk_ns",
    "sent",
    "first",
    "end",
    "sent_all",
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _field_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and node.args:  # df["end_ns"].astype(...), _col(df, "end_ns")
        return _field_name(node.func.value) if isinstance(node.func, ast.Attribute) else _field_name(node.args[-1])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def test_stage_layers_and_no_import_cycles():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_only_metrics_computes_latencies_from_records():
    offenders = []
    for path in _sources():
        if path == PACKAGE / "metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
                names = {_field_name(node.left), _field_name(node.right)}
                if len(names & _TIMESTAMP_FIELDS) == 2:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "diff"
                and node.args
                and "chunk" in ast.unparse(node.args[0])
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"latency math outside llmplay/metrics.py: {offenders}"


def test_function_level_imports_say_why_they_are_deferred():
    undocumented = []
    for path in _sources():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    here = lines[node.lineno - 1]
                    above = lines[node.lineno - 2] if node.lineno > 1 else ""
                    if "deferred" not in here and "deferred" not in above:
                        undocumented.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not undocumented, f"function-level imports without a '# deferred: reason' comment: {undocumented}"


def test_readme_architecture_names_every_stage():
    section = README.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    stages = [p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    stages += [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    missing = [name for name in sorted(stages) if f"`{name}`" not in section]
    assert not missing, f"README's architecture section does not name: {missing}"

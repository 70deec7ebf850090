from pathlib import Path
def render_report(run_dir: Path) -> Path:
    p = Path(run_dir) / "report.html"; p.write_text("<html></html>"); return p

"""A benchmark's run replaces its results in ``benchmarks/results/*.md`` and keeps the
notes people wrote there (before, each run overwrote the whole file)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _functions():
    spec = importlib.util.spec_from_file_location(
        "bench_functions", ROOT / "benchmarks" / "functions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_replaces_its_results_and_keeps_the_notes(tmp_path, capsys):
    f = _functions()
    out = tmp_path / "results" / "x.json"
    f.write_results(out, {"p50": 1.0}, "# X\n\n| a |\n| 1 |\n")
    md = out.with_suffix(".md")
    md.write_text(md.read_text() + "\n## Notes of a session\n\nWhy 1 is slow.\n")

    f.write_results(out, {"p50": 2.0}, "# X\n\n| a |\n| 2 |\n")
    text = md.read_text()
    assert "| 2 |" in text and "| 1 |" not in text
    assert text.endswith("## Notes of a session\n\nWhy 1 is slow.\n")
    assert text.count(f.RESULTS_START) == 1 and text.count(f.RESULTS_END) == 1
    assert json.loads(out.read_text()) == {"p50": 2.0}
    assert "| 2 |" in capsys.readouterr().out


def test_a_file_written_before_the_markers_is_kept_below_the_results(tmp_path):
    f = _functions()
    out = tmp_path / "y.json"
    old = "# Y by hand\n\n## 2026-12-01\n\nA run and what it showed.\n"
    out.with_suffix(".md").write_text(old)
    f.write_results(out, {}, "# Y\n\nnew table\n")
    text = out.with_suffix(".md").read_text()
    assert text.startswith(f.RESULTS_START + "\n# Y\n\nnew table\n" + f.RESULTS_END)
    assert text.endswith(old)

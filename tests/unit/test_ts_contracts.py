"""``labextension/src/contracts.ts`` is generated from the pydantic contracts and current."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "labextension" / "scripts" / "generate_contracts.py"


def _generator():
    spec = importlib.util.spec_from_file_location("generate_contracts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_typescript_contracts_are_current(tmp_path):
    gen = _generator()
    fresh = tmp_path / "contracts.ts"
    fresh.write_text(gen.render(gen.schema()))
    committed = (ROOT / "labextension" / "src" / "contracts.ts").read_text()
    assert committed == fresh.read_text(), (
        "labextension/src/contracts.ts is stale: run "
        "python labextension/scripts/generate_contracts.py and commit the result"
    )


def test_generated_types_cover_what_the_sidebar_reads():
    gen = _generator()
    text = gen.render(gen.schema())
    assert "export interface IJob {" in text
    assert "export type JobState = 'queued' | 'scheduled' | 'running'" in text
    assert "  pending_reasons: string[];" in text
    assert "  gpus: IGpuSample[];" in text
    assert "  utilization_percent: number | null;" in text

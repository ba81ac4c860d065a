"""Write Nemotron-3-Nano-30B-A3B's config as transformers 5.x saves it.

transformers 5.x's `NemotronHConfig` turns the published `hybrid_override_pattern` into
`layers_block_type` (`"linear_attention"` for a Mamba-2 mixer, `"full_attention"`, `"moe"`,
`"mlp"`) and writes that list, not the pattern, to `config.json`. This script builds the config
class from the bundled preset and saves it with `save_pretrained`, so the test reads exactly
what transformers writes. Output: ``tests/fixtures/nemotron_h_transformers5/config.json``.

Run it from the repository root in the torch environment (see tools/README.md)::

    python tools/make_nemotron_h_v5_config.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import transformers
from transformers import NemotronHConfig

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "jaxarena" / "presets" / "nemotron-3-nano-30b-a3b.json"
OUT = ROOT / "tests" / "fixtures" / "nemotron_h_transformers5" / "config.json"


def main() -> None:
    raw = json.loads(PRESET.read_text())
    config = NemotronHConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        saved = json.loads((Path(tmp) / "config.json").read_text())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    kinds = sorted(set(saved.get("layers_block_type") or []))
    print(f"{OUT.relative_to(ROOT)}: transformers {transformers.__version__}, kinds {kinds}")


if __name__ == "__main__":
    main()

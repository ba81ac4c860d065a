"""Parameter counts of the configs issues 27 and 31 fixed: DeepSeek-V3.2's lightning indexer and
Kimi K2 read as its architecture, against transformers' counts in
`tests/fixtures/hf_param_counts.json` (`tools/make_param_counts.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from jaxarena import ModelConfig
from jaxarena._sizing import weights as W

FIXTURE = Path(__file__).parent.parent / "fixtures" / "hf_param_counts.json"
TABLE = json.loads(FIXTURE.read_text())["presets"]


def test_deepseek_v32_counts_the_lightning_indexer():
    # Issue 27: per layer transformers' DeepseekV32Indexer holds wq_b (q latent -> 64 x 128),
    # wk (h -> 128), k_norm (a LayerNorm: weight and bias) and weights_proj (h -> 64 heads).
    h, q_lora, heads, dim = 7168, 1536, 64, 128
    per_layer = q_lora * heads * dim + h * dim + 2 * dim + h * heads
    v32, v3 = ModelConfig.preset("deepseek-v3.2"), ModelConfig.preset("deepseek-v3")
    assert W.param_count(v32) - W.param_count(v3) == 61 * per_layer == 851_524_864
    assert W.param_count(v32) == TABLE["deepseek-v3.2"]["total"]


def test_kimi_k2_is_counted_as_deepseek_v3_reads_it():
    # Issue 31: one dense first layer (first_k_dense_replace: 1), 60 MoE layers of 384 experts.
    entry = TABLE["kimi-k2-instruct"]
    assert entry["read_as"] == "deepseek_v3"
    assert W.param_count(ModelConfig.preset("kimi-k2-instruct")) == entry["total"]
    assert entry["total"] == 1_026_408_209_408

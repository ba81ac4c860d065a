"""Bad checkpoints give one clear error naming the file or tensor, before anything is placed on
the device: missing, extra and misshapen tensors, a config that disagrees with the weights,
dtype surprises, truncated files, missing shards, unsupported families and features."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from lm_runs import CHECKPOINTS, LIMITS

from jaxarena import ConfigError
from jaxarena.models import CheckpointError, load_pretrained
from jaxarena.models.checkpoint import DTYPES, open_checkpoint

_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: u64 header length, JSON header, the bytes back to back."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}  # fmt: skip
        blobs.append(b)
        off += len(b)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def tensors_of(name: str) -> dict[str, np.ndarray]:
    ck = open_checkpoint(CHECKPOINTS / name)
    return {k: np.array(ck[k]) for k in ck}


def make(tmp_path: Path, src: str = "llama", *, tensors=None, config=None) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    cfg = json.loads((CHECKPOINTS / src / "config.json").read_text())
    if config:
        cfg.update(config)
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", tensors if tensors is not None else tensors_of(src))
    return d


def load(path):
    return load_pretrained(path, **LIMITS)


def test_the_writer_round_trips(tmp_path):
    """The bad checkpoints below differ from a good one only where each test says."""
    d = make(tmp_path)
    a, b = open_checkpoint(d), open_checkpoint(CHECKPOINTS / "llama")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a.dtype_name(k) == b.dtype_name(k)
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_missing_tensor(tmp_path):
    t = tensors_of("llama")
    del t["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"
    ):
        load(make(tmp_path, tensors=t))


def test_extra_tensor(tmp_path):
    t = tensors_of("llama")
    t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, ml_dtypes.bfloat16)
    with pytest.raises(CheckpointError, match=r"does not use: \['model\.layers\.0\.self_attn"):
        load(make(tmp_path, tensors=t))


def test_wrong_shape(tmp_path):
    t = tensors_of("llama")
    t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((48, 64), ml_dtypes.bfloat16)
    with pytest.raises(CheckpointError, match=r"k_proj\.weight' in model\.safetensors has shape "
                       r"\[48, 64\] but config\.json implies \[32, 64\]"):  # fmt: skip
        load(make(tmp_path, tensors=t))


def test_config_disagrees_with_weights(tmp_path):
    d = make(tmp_path, config={"intermediate_size": 96})
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight.*\[128, 64\].*\[96, 64\]"):
        load(d)


def test_dtype_surprise(tmp_path):
    t = tensors_of("llama")
    t["model.norm.weight"] = np.ones(64, np.int32)
    with pytest.raises(
        CheckpointError, match=r"'model\.norm\.weight' has dtype I32, expected BF16"
    ):
        load(make(tmp_path, tensors=t))


def test_fp8_weight_in_a_bf16_checkpoint(tmp_path):
    t = tensors_of("llama")
    w = "model.layers.0.mlp.down_proj.weight"
    t[w] = t[w].astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(CheckpointError, match=r"down_proj\.weight' has dtype F8_E4M3"):
        load(make(tmp_path, tensors=t))


def test_fp8_checkpoint_without_block_scales(tmp_path):
    t = tensors_of("qwen3_fp8")
    del t["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    with pytest.raises(CheckpointError, match=r"o_proj\.weight_scale_inv' is missing"):
        load(make(tmp_path, "qwen3_fp8", tensors=t))


def test_truncated_file(tmp_path):
    d = make(tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor '.*': its bytes end at "
                       r"\d+ but the file has \d+; the file is truncated"):  # fmt: skip
        load(d)
    f.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="too short for a safetensors file"):
        load(d)


def test_missing_shard(tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(CHECKPOINTS / "llama_sharded", d)
    (d / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"lists shard 'model-00002-of-00003\.safetensors', "
                       "which is missing"):  # fmt: skip
        load(d)


def test_no_weights_or_no_config(tmp_path):
    d = make(tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load(d)
    with pytest.raises(CheckpointError, match="not a directory"):
        load(tmp_path / "nowhere")


def test_unsupported_family_and_features(tmp_path):
    with pytest.raises(NotImplementedError, match=r"model_type='gpt2' is not supported; "
                       "supported: llama, mistral, qwen3, mamba2, nemotron_h"):  # fmt: skip
        load(make(tmp_path, config={"model_type": "gpt2"}))
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(NotImplementedError, match="rope_type='proportional'"):
        load(make(tmp_path, config={"rope_parameters": {"rope_type": "proportional",
                                                        "rope_theta": 1e4}}))  # fmt: skip
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"config\.json: rope_type='llama3' needs 'factor'"):
        load(make(tmp_path, config={"rope_parameters": {"rope_type": "llama3",
                                                        "rope_theta": 1e4}}))  # fmt: skip
    shutil.rmtree(tmp_path / "ckpt")
    q = {"quant_method": "fp8", "weight_block_size": [64, 64]}
    with pytest.raises(NotImplementedError, match=r"weight_block_size=\[64, 64\]"):
        load(make(tmp_path, "qwen3_fp8", config={"quantization_config": q}))


def test_invalid_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="hidden_size"):
        load(make(tmp_path, config={"hidden_size": "64"}))

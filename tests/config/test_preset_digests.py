"""Every bundled preset that copies a published config.json is byte-for-byte (canonically) that
config: digests recorded here, checked against the bundled files and, when present, the design
repository's shared/models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import jaxarena
from jaxarena import presets

PRESET_DIR = Path(jaxarena.__file__).parent / "presets"
SHARED_MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
PUBLISHED_COPIES = Path(__file__).resolve().parents[1] / "fixtures" / "published_models"


# SHA-256 of the canonical JSON (sorted keys, no spaces) of each published model's config.json
# as kept in the design repository's shared/models (the configs the presets were copied from),
# recorded here so the check always runs, with or without that repository beside this one.
# Presets of our own (tiny-hybrid) have no published config.
PUBLISHED_CONFIG_SHA256 = {
    "deepseek-v2-lite": "d77621a6acc58e279d33f525d53f608cf671450e56864368095eb5ea295cc710",
    "deepseek-v3": "fed8c13b4637058cd68e600bd4bf7dc734bda4594dd583e3b49fa27c6e123cc6",
    "deepseek-v4-flash-fixture": "afe02c1fd6cd33b385ca4f110d27b3137b9ef806ca6d25955fb6cf9bef903a4e",
    "gpt-oss-20b": "fcfce87c5277689cce2b8c8ef5336a7385157bfe623dbe321cfe4904b0942102",
    "kimi-k2-instruct": "9627bdae54d551099a2490e2b12a96c7017e8564e961551466f93ecbe5a751bd",
    "llama3.1-8b": "bf0a9ac88871834860e816600ee6174a576f3086b3845173463db3e997eb26d1",
    "longcat-flash-lite-fixture": "c37a49f777ffa3b46374653f1292d720a0a24f0b0413b4b5b743272f6206a594",
    "longcat-flash": "1e5f37b931e9b251fe6ab836426070d686fabf8a799de37876a76b646332ee3a",
    "mamba2-2.7b": "4da1708125f555bbab93b079dddab418a22f7dc8f78cf2066f556d2cead13529",
    "mixtral-8x7b": "d963f9c550de07c84fdc1012c27636d6cca86273f5b114e822cc34842e3c1a4c",
    "nemotron-3-nano-30b-a3b": "9bddf1a2459b9a8f7cb9049b31c1bd3edbe7e9d81cfa5558da030cf14572b184",
    "nemotron-h-8b": "47af4a181321128e6858c4048f391ce225707233ebc2f18c6b8b0b73f41918aa",
    "nemotron-h-puzzle-latentmoe-fixture": "4834dd9f64d4e671a63150514e33943b172513d9a675d0d7bc464b0769e69ab7",
    "qwen3-30b-a3b": "50defee8f5577af237bee7679a702159d0f1b287875c14ff28aced29d2547988",
    "qwen3-32b": "f7b15097c58db24a59030f0e57775b2b49b33e2ee294fb85ff0ade5b902c489b",
    "qwen3-8b": "fd4b10f2795e3d106d9452f6b36aba1bc573c1a3a846f8968ae209cd0e191ce9",
    "qwen3-next-80b-a3b": "8ebf20ebe78bd562409320776ba1880cd7473bd5edc6a9ec8e37d2fc01ad1741",
    "qwen3-vl-30b-a3b": "48dffe0e171228f78f22ce57d72974c8e232c30daace1a2206684dc54ea3f247",
    "qwen3-vl-8b": "475f2267704fa0828d95ed1058926b8b7d05f34ceba0eb9840d94690fa0fda34",
    "qwen3.5-35b-a3b": "43794fb330522d058bda1093c1f4ce1a6d7f13ea12bb1abfe4d10a428a564b2b",
    "qwen3.8-flash-next-fixture": "6269e67925d8db75c23169e35f84e83e5cd79ec0ea781fe85c0431ea0b19f2ee",
}


def _canonical_sha256(obj) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIG_SHA256))
def test_preset_is_the_published_config(name):
    bundled = json.loads((PRESET_DIR / f"{name}.json").read_text())
    assert _canonical_sha256(bundled) == PUBLISHED_CONFIG_SHA256[name]


def test_every_published_preset_has_a_digest():
    # deepseek-v3.2 is assembled (see its EXPECTED row), tiny-hybrid is our own.
    assert sorted(set(presets()) - {"tiny-hybrid", "deepseek-v3.2"}) == sorted(
        PUBLISHED_CONFIG_SHA256
    )


def test_published_model_files_agree_with_the_recorded_digests():
    """Every recorded digest is that of a published config: the files of the design
    repository's shared/models when it is beside this checkout (CI: a changed upstream config
    is noticed), else the byte copies in tests/fixtures/published_models (a plain clone)."""
    source = SHARED_MODELS if SHARED_MODELS.is_dir() else PUBLISHED_COPIES
    for name, digest in PUBLISHED_CONFIG_SHA256.items():
        path = source / f"{name}.json"
        assert path.is_file(), f"{path} is missing: no published config to check {name!r} against"
        assert _canonical_sha256(json.loads(path.read_text())) == digest, path


def test_published_copies_are_the_shared_files():
    """The fixture copies stay byte-identical to shared/models (checked where it is present)."""
    if not SHARED_MODELS.is_dir():
        pytest.skip(f"{SHARED_MODELS} is absent (a plain clone): the copies are checked by digest")
    copies = sorted(p.name for p in PUBLISHED_COPIES.glob("*.json"))
    assert copies == sorted(f"{name}.json" for name in PUBLISHED_CONFIG_SHA256)
    for name in copies:
        assert (PUBLISHED_COPIES / name).read_bytes() == (SHARED_MODELS / name).read_bytes(), name

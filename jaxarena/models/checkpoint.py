"""Reading a local HuggingFace checkpoint directory: `config.json` and its safetensors files.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of the
header), then the raw little-endian bytes. The `safetensors` package's numpy and flax readers
go through numpy dtypes, which have no bfloat16 or float8, so this module reads the header
itself and views the bytes with the `ml_dtypes` types JAX uses. Nothing is copied before the
caller asks for a tensor: the files are memory-mapped.

`Reader` takes the tensors a model uses out of a `Checkpoint` by name, checking each shape
against what `config.json` implies, and keeps FP8 block-quantized linear weights
(`FP8Spec`, from `quantization_config`) as `{"w", "scale_inv"}`.

Every problem (a missing file, a truncated or corrupt file, a tensor whose bytes do not match
its dtype and shape, a name given twice) raises `CheckpointError` naming the file and tensor.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["CheckpointError", "Checkpoint", "open_checkpoint", "DTYPES", "FP8Spec", "Reader",
           "fp8_spec", "FLOAT_DTYPES"]  # fmt: skip

# safetensors dtype name -> numpy dtype (bfloat16 / float8 from ml_dtypes).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}

# A header larger than this is not a checkpoint header (the format caps it at 100 MB).
_MAX_HEADER = 100_000_000


class CheckpointError(ValueError):
    """A checkpoint directory or safetensors file is missing, corrupt or does not fit the
    model; the message names the file and the tensor."""


class _File:
    """One memory-mapped safetensors file with its parsed and validated header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise CheckpointError(
                        f"{path}: {size} bytes, too short for a safetensors file (the 8-byte "
                        "header length is missing); the file is truncated or not safetensors"
                    )
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise CheckpointError(
                        f"{path}: header length {n} does not fit the file's {size} bytes; the "
                        "file is truncated or not safetensors"
                    )
                raw = fh.read(n)
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from e
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: the header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: the header is not a JSON object")
        header.pop("__metadata__", None)
        self.base = 8 + n
        self.size = size
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            self.entries[name] = self._entry(name, e)

    def _entry(self, name: str, e: Any) -> tuple[str, tuple[int, ...], int, int]:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            raise CheckpointError(f"{where}: header entry {e!r} lacks dtype/shape/data_offsets")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPES:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1]):  # fmt: skip
            raise CheckpointError(f"{where}: data_offsets {offs!r} are not [begin, end]")
        begin, end = offs
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        if end - begin != want:
            raise CheckpointError(
                f"{where}: {end - begin} data bytes for {dtype}{shape}, which needs {want}"
            )
        if self.base + end > self.size:
            raise CheckpointError(
                f"{where}: its bytes end at {self.base + end} but the file has {self.size}; "
                "the file is truncated (re-download or re-save it)"
            )
        return dtype, tuple(shape), begin, end

    def array(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self.entries[name]
        buf = np.frombuffer(self._map, np.uint8, end - begin, self.base + begin) if end > begin \
            else np.zeros(0, np.uint8)  # fmt: skip
        return buf.view(DTYPES[dtype]).reshape(shape)


class Checkpoint(Mapping[str, np.ndarray]):
    """The tensors of a checkpoint directory by HuggingFace name (read-only numpy views).

    Attributes:
      path: the directory.
      config: the parsed `config.json`.
      files: the safetensors files read.
    """

    def __init__(self, path: Path, config: dict[str, Any], files: list[_File]) -> None:
        self.path = path
        self.config = config
        self.files = files
        self._where: dict[str, _File] = {}
        for f in files:
            for name in f.entries:
                if name in self._where:
                    raise CheckpointError(
                        f"{path}: tensor {name!r} appears in both {self._where[name].path.name} "
                        f"and {f.path.name}"
                    )
                self._where[name] = f

    def __getitem__(self, name: str) -> np.ndarray:
        return self._where[name].array(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def dtype_name(self, name: str) -> str:
        """The safetensors dtype name (`"BF16"`, `"F8_E4M3"`, ...) of tensor `name`."""
        return self._where[name].entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name].entries[name][1]

    def file_of(self, name: str) -> str:
        return self._where[name].path.name


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Opens a checkpoint directory: `config.json` plus `model.safetensors` or the shards listed
    in `model.safetensors.index.json`.

    Raises:
      CheckpointError: the directory, `config.json` or a listed shard is missing; a file is
        truncated or corrupt; the index names a tensor its shard lacks (or the shard holds one
        the index does not name).
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (expected a checkpoint directory with "
                              "config.json and *.safetensors)")  # fmt: skip
    cfg_path = root / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"{root}: no config.json") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{cfg_path}: cannot parse ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: the top level must be a JSON object")
    index = root / "model.safetensors.index.json"
    single = root / "model.safetensors"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{index}: no readable weight_map ({e!r})") from e
        names = sorted(set(weight_map.values()))
        files = []
        for n in names:
            if not (root / n).is_file():
                raise CheckpointError(f"{index}: lists shard {n!r}, which is missing from {root}")
            files.append(_File(root / n))
        ckpt = Checkpoint(root, config, files)
        for tensor, shard in weight_map.items():
            if tensor not in ckpt._where or ckpt.file_of(tensor) != shard:
                raise CheckpointError(f"{index}: maps tensor {tensor!r} to {shard}, which does "
                                      "not hold it")  # fmt: skip
        for tensor in ckpt:
            if tensor not in weight_map:
                raise CheckpointError(f"{ckpt.file_of(tensor)}: holds tensor {tensor!r}, which "
                                      f"{index.name} does not list")  # fmt: skip
        return ckpt
    if single.is_file():
        return Checkpoint(root, config, [_File(single)])
    raise CheckpointError(f"{root}: neither model.safetensors nor model.safetensors.index.json "
                          "(only safetensors checkpoints are read)")  # fmt: skip


# -- reading a model's tensors -------------------------------------------------------------------

FLOAT_DTYPES = ("BF16", "F16", "F32")


@dataclasses.dataclass(frozen=True)
class FP8Spec:
    """An FP8 block-quantized checkpoint: the weight block and the modules left unquantized."""

    block: tuple[int, int]
    skip: tuple[str, ...]

    def quantized(self, module: str) -> bool:
        """Whether `module`'s weight is stored FP8: transformers' rule, unquantized when any
        listed key is a substring of its name; the LM head is never quantized."""
        return not any(k in module for k in self.skip) and module != "lm_head"


def fp8_spec(raw: dict[str, Any], path: Path) -> FP8Spec | None:
    """The FP8 scheme of `config.json` (`raw`), None for a float checkpoint.

    Raises:
      NotImplementedError: a quantization other than e4m3 weights in 128 x 128 blocks with
        dynamic activation scales.
    """
    q = raw.get("quantization_config")
    if q is None:
        return None

    def unsupported(what: str) -> NotImplementedError:
        return NotImplementedError(f"{path / 'config.json'}: {what}")

    if isinstance(q, dict) and q.get("quant_method") == "mxfp4":
        raise unsupported("quantization_config quant_method='mxfp4': MXFP4 expert weights (as "
                          "the gpt-oss releases ship) are not implemented; load a bf16 "
                          "checkpoint (dequantized) instead")  # fmt: skip
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise unsupported(f"quantization_config quant_method={method!r}; only 'fp8'")
    if q.get("fmt", "e4m3") != "e4m3" or q.get("activation_scheme", "dynamic") != "dynamic":
        raise unsupported("FP8 checkpoints other than e4m3 weights with dynamic activation "
                          "scales are not implemented")  # fmt: skip
    block = q.get("weight_block_size")
    if block != [128, 128]:
        raise unsupported(f"weight_block_size={block!r}; only [128, 128] (one scale per "
                          "128 x 128 block) is implemented")  # fmt: skip
    return FP8Spec(block=(128, 128), skip=tuple(q.get("modules_to_not_convert") or ()))


class Reader:
    """Takes tensors out of a checkpoint by name, checking presence, shape and dtype, and
    records which it took (`unused()` lists the rest)."""

    def __init__(self, ckpt: Checkpoint, fp8: FP8Spec | None) -> None:
        self.ckpt, self.fp8 = ckpt, fp8
        self.used: set[str] = set()

    def _where(self, name: str) -> str:
        return f"{self.ckpt.path}: tensor {name!r}"

    def raw(self, name: str, shape: tuple[int, ...], dtypes: Sequence[str]) -> np.ndarray:
        """Tensor `name` as stored (memory-mapped), after checking its shape and dtype."""
        if name not in self.ckpt:
            raise CheckpointError(f"{self._where(name)} is missing (expected shape "
                                  f"{list(shape)} from config.json)")  # fmt: skip
        got = self.ckpt.shape(name)
        if got != tuple(shape):
            raise CheckpointError(f"{self._where(name)} in {self.ckpt.file_of(name)} has shape "
                                  f"{list(got)} but config.json implies {list(shape)}; the "
                                  "config and the weights disagree")  # fmt: skip
        dt = self.ckpt.dtype_name(name)
        if dt not in dtypes:
            raise CheckpointError(f"{self._where(name)} has dtype {dt}, expected "
                                  f"{' or '.join(dtypes)}")  # fmt: skip
        self.used.add(name)
        return self.ckpt[name]

    def vector(self, name: str, n: int) -> np.ndarray:
        """A float vector `[n]` (copied)."""
        return np.array(self.raw(name, (n,), FLOAT_DTYPES))

    def matrix(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A float matrix `[rows, cols]` (copied)."""
        return np.array(self.raw(name, (rows, cols), FLOAT_DTYPES))

    def linear(self, module: str, out: int, inp: int) -> Any:
        """`[in, out]` float weight, or the FP8 dict `{"w": [out, in], "scale_inv"}`."""
        name = module + ".weight"
        if self.fp8 is not None and self.fp8.quantized(module):
            bo, bi = self.fp8.block
            w = self.raw(name, (out, inp), ("F8_E4M3",))
            s = self.raw(module + ".weight_scale_inv", (-(-out // bo), -(-inp // bi)), ("F32",))
            return {"w": np.array(w), "scale_inv": np.array(s)}
        return np.ascontiguousarray(self.raw(name, (out, inp), FLOAT_DTYPES).T)

    def qkv(self, prefix: str, cfg: Any) -> Any:
        """`{prefix}.{q,k,v}_proj` of a GQA block: one `[hidden, (Hq + 2 Hkv) D]` float matrix,
        or a (q, k, v) tuple when any of them is FP8."""
        h, hd = cfg.hidden_size, cfg.head_dim
        parts = [self.linear(f"{prefix}.{n}_proj", heads * hd, h) for n, heads in
                 (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads),
                  ("v", cfg.num_key_value_heads))]  # fmt: skip
        if all(isinstance(p, np.ndarray) for p in parts):
            return np.concatenate(parts, axis=1)  # one [hidden, (Hq + 2 Hkv) D] matmul
        return tuple(parts)

    def kv_scales(self, prefix: str, num_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
        """The FP8 KV cache's dequantization scales of attention module `prefix`, as vLLM
        reads them: `(k_scale, v_scale)`, each `float32[num_kv_heads]` (a per-tensor scale
        repeated), 1.0 where the checkpoint has none.

        Names tried, first found wins (vLLM's `maybe_remap_kv_scale_name` and the
        compressed-tensors loader): `{prefix}.k_scale` / `.v_scale` (llm-compressor),
        `{prefix}.k_proj.k_scale` / `.v_proj.v_scale` (ModelOpt), `{prefix}.k_proj.output_scale`
        / `.v_proj.output_scale` (older compressed-tensors), `{prefix}.kv_scale` (deprecated:
        one scale for both). Each is a float scalar of shape `()` or `(1,)`, or
        `(num_kv_heads,)`, finite and > 0. The tensors found count as used whether or not the
        cache is FP8 (a bf16 cache ignores them, as vLLM does).

        Raises:
          CheckpointError: a scale of another shape or dtype, or one that is not finite and
            positive (the message names the tensor).
        """
        candidates = {
            "k": (f"{prefix}.k_scale", f"{prefix}.k_proj.k_scale", f"{prefix}.k_proj.output_scale",
                  f"{prefix}.kv_scale"),
            "v": (f"{prefix}.v_scale", f"{prefix}.v_proj.v_scale", f"{prefix}.v_proj.output_scale",
                  f"{prefix}.kv_scale"),
        }  # fmt: skip
        out = []
        for which in ("k", "v"):
            scale = np.ones((num_kv_heads,), np.float32)
            names = [n for n in candidates[which] if self.ckpt is not None and n in self.ckpt]
            if names:
                name = names[0]
                shape = self.ckpt.shape(name)
                if shape not in ((), (1,), (num_kv_heads,)):
                    raise CheckpointError(
                        f"{self._where(name)} has shape {list(shape)}; a KV cache scale is "
                        f"per tensor ([] or [1]) or per KV head ([{num_kv_heads}])"
                    )
                self.raw(name, shape, FLOAT_DTYPES)  # checks the dtype, records the use
                # The values from the file itself (a shapes-only reader's `raw` gives zeros).
                vals = np.asarray(self.ckpt[name], np.float32).reshape(-1)
                if not np.all(np.isfinite(vals) & (vals > 0)):
                    raise CheckpointError(f"{self._where(name)} = {vals.tolist()}: a KV cache "
                                          "scale must be finite and > 0")  # fmt: skip
                scale = np.broadcast_to(vals, (num_kv_heads,)).astype(np.float32)
            out.append(scale)
        return out[0], out[1]

    def expert_ids(self, num_experts: int) -> range:
        """The routed experts whose weights to read (all; a device's share under expert
        parallelism: `tensor_parallel.ShardReader`)."""
        return range(num_experts)

    def unused(self) -> list[str]:
        """The checkpoint's tensors nobody read, sorted."""
        return sorted(set(self.ckpt) - self.used)

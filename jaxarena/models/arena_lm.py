"""The one decoder implementation that runs on an arena: Llama/Mistral/Qwen3, Mamba-2,
Nemotron-H and the random-weight reference hybrid are all cases of `ArenaLM`.

A model is a stack of residual *blocks* (`Arch.blocks`): `x += mixer(rmsnorm(x))`, where the
mixer is one of
- `"attention"`: GQA over a paged bf16 KV cache (vLLM layout), optional per-head q/k RMSNorm
  (Qwen3) and RoPE (rotate-half; Nemotron-H has none). Prefill attends densely within each
  packed sequence; decode runs the split-K Pallas kernel (partials in `splitk_workspace`,
  output in `attn_output`).
- `"mamba"`: Mamba-2. in_proj -> causal depthwise conv1d (kernel 4) -> SSD scan (prefill: the
  `ssd_chunked_scan` Pallas kernel with its scratch in `ssd_scratch`; decode: the one-step
  update) -> gate with silu(z) -> grouped RMSNorm -> out_proj.
- `"mlp"`: `relu2` (`down(relu(up x)^2)`, Nemotron-H) or `swiglu` (`down(silu(gate x) * up x)`,
  Llama). A Llama decoder layer is two blocks, attention then MLP.
then a final RMSNorm and the LM head (tied to the embeddings or not).

Linear layers. A weight in `params` is one of
- a float array `[in, out]` (bf16 from a checkpoint, f32 for random weights): `x @ w`;
- an FP8 weight `{"w": float8_e4m3fn[out, in], "scale_inv": float32[ceil(out/128),
  ceil(in/128)]}` (the Qwen3-FP8 / DeepSeek-V3 format): the input is quantized 1 x 128 by the
  `fp8_block_quant` kernel into the arena's FP8 regions and multiplied block-scaled;
- a tuple of those (q/k/v, gate/up): the outputs concatenated; the input is quantized once.
With `Arch.fp8_mlp_acts` (the reference hybrid) the MLP's float weights also multiply FP8
activations.

Arena discipline: every intermediate the seed gives a buffer for is written to and read back
from the arena at the plan's offsets (`hidden_states`, `residual`, `norm_output`, `qkv_output`,
`attn_output`, `ssm_qkvz`, `ssm_deinterleaved`, `expert_gate_out`, `expert_up_out`,
`moe_output`, `logits`, the FP8 buffers, `splitk_workspace`, `ssd_scratch`), stored as
bfloat16 (the seed sizes activations for bf16); arithmetic is float32. XLA orders in-place
updates by data dependencies only, so each block re-reads what it needs from the newest arena
where it uses it, and results that leave the arena (the caches) are tied to it with
`lax.optimization_barrier` before the next write.

`prefill` and `decode_step` are pure; jit them with the arena and the caches donated
(`jax.jit(model.decode_step, donate_argnums=(1, 2))`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, Levers, ModelConfig, Target, workspaces
from pallas_kernels import (
    fp8_block_quant_into,
    splitk_decode_attention_into,
    ssd_chunked_scan_into,
    ssd_state_update,
)

__all__ = ["Arch", "ArenaLM", "BLOCK_KINDS", "FFN_QUANT_REGIONS"]

BLOCK_KINDS = ("attention", "mamba", "mlp")
BF16 = jnp.bfloat16
F32 = jnp.float32
CONV_KERNEL = 4
# The FFN down projection quantizes into the dense-FFN activation buffers (when its K, the
# intermediate size, is a multiple of 128; see `workspaces.ffn_fp8_uses_seed_regions`).
FFN_QUANT_REGIONS = ("ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arch:
    """What distinguishes one family from another (static, hashable).

    Attributes:
      blocks: the mixer of each residual block, in order (`BLOCK_KINDS`).
      mlp: `"relu2"` or `"swiglu"`.
      rope: attention applies rotary embeddings (rotate-half form) with `rope_theta`.
      qk_norm: attention RMS-normalizes each q and k head before RoPE (Qwen3).
      rms_eps: epsilon of every RMSNorm (block, q/k, Mamba gate, final).
      tie_embeddings: the LM head is the embedding matrix (no `lm_head` parameter).
      fp8_mlp_acts: MLP projections multiply FP8-quantized activations even when their weights
        are float (the reference hybrid model's choice).
    """

    blocks: tuple[str, ...]
    mlp: str = "relu2"
    rope: bool = True
    rope_theta: float = 10000.0
    qk_norm: bool = False
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    fp8_mlp_acts: bool = False

    def __post_init__(self) -> None:
        bad = [b for b in self.blocks if b not in BLOCK_KINDS]
        if bad:
            raise ValueError(f"Arch.blocks has unknown kinds {bad}; known: {BLOCK_KINDS}")
        if self.mlp not in ("relu2", "swiglu"):
            raise ValueError(f"Arch.mlp={self.mlp!r} must be 'relu2' or 'swiglu'")


def _is_fp8(w: Any) -> bool:
    return isinstance(w, dict) and "scale_inv" in w


def _parts(w: Any) -> tuple[Any, ...]:
    return tuple(w) if isinstance(w, (tuple, list)) else (w,)


def _dequant_weight(w: dict[str, jax.Array]) -> jax.Array:
    """`float32[in, out]` of an FP8 weight (only where the activation cannot be quantized)."""
    q, s = w["w"], w["scale_inv"]
    n, k = q.shape
    full = jnp.repeat(jnp.repeat(s, workspaces.FP8_BLOCK, 0), workspaces.FP8_BLOCK, 1)[:n, :k]
    return (q.astype(F32) * full).T


def fp8_block_matmul(xq: jax.Array, xs: jax.Array, w: dict[str, jax.Array]) -> jax.Array:
    """Block-scaled product of 1 x 128 quantized activations and 128 x 128 quantized weights.

    Args:
      xq: `float8_e4m3fn[T, K]` activations; xs: `float32[T, ceil(K/128)]` their scales.
      w: `{"w": float8_e4m3fn[N, K], "scale_inv": float32[ceil(N/128), ceil(K/128)]}`.

    Returns:
      `float32[T, N]`: `sum_b xs[t, b] * scale_inv[n // 128, b] * (xq[t, blk b] . w[n, blk b])`;
      the per-block dot products are exact products of e4m3 values (bf16 operands, exact)
      accumulated in f32.
    """
    blk = workspaces.FP8_BLOCK
    t, k = xq.shape
    wq, ws = w["w"], w["scale_inv"]
    n = wq.shape[0]
    nb = xs.shape[1]
    pad = nb * blk - k
    # e4m3 values are exact in bf16, and a product of two bf16 values is exact in f32.
    xb = jnp.pad(xq.astype(BF16), ((0, 0), (0, pad))).reshape(t, nb, blk)
    wb = jnp.pad(wq.astype(BF16), ((0, 0), (0, pad))).reshape(n, nb, blk)
    partial = jnp.einsum("tbk,nbk->tnb", xb, wb, preferred_element_type=F32)
    wsn = jnp.repeat(ws, blk, axis=0)[:n]
    return jnp.einsum("tnb,tb,nb->tn", partial, xs, wsn)


def _rms(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding (rotate-half form) of `x [T, heads, D]` at `positions [T]`."""
    d = x.shape[-1]
    inv = theta ** (-jnp.arange(0, d // 2, dtype=F32) * 2 / d)
    ang = positions.astype(F32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArenaLM:
    """A decoder bound to one arena plan (see the module docstring for the blocks).

    Attributes:
      config: the model dimensions (the same `ModelConfig` the plan was sized from).
      arch: the family's structure (`Arch`).
      plan: the arena layout, from `BufferSizes.from_config` at the serve limits (or packed).
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits the plan
        was sized for.
      target, levers: what sized the split-K workspace; the decode kernel uses the same policy.
      interpret: Pallas interpret mode (None: on CPU).
    """

    config: ModelConfig
    arch: Arch
    plan: ArenaPlan
    max_batch_tokens: int
    max_seq_len: int
    kv_block_size: int
    max_batch_size: int
    target: Target
    levers: Levers
    interpret: bool | None = None

    # -- caches ----------------------------------------------------------------------------------

    def init_caches(self, *, num_blocks: int, rows: int) -> dict[str, Any]:
        """Zeroed decode caches: per attention block a paged bf16 KV cache
        (`k`, `v`: `[num_blocks, kv_block_size, Hkv, D]`), per Mamba block the f32 SSM state
        (`[rows, H, P, N]`) and the conv window (`[rows, 3, d_xbc]`)."""
        c = self.config
        kv, ssm = [], []
        for kind in self.arch.blocks:
            if kind == "attention":
                shape = (num_blocks, self.kv_block_size, c.num_key_value_heads, c.head_dim)
                kv.append({"k": jnp.zeros(shape, BF16), "v": jnp.zeros(shape, BF16)})
            elif kind == "mamba":
                ssm.append({
                    "state": jnp.zeros((rows, c.mamba_num_heads, c.mamba_head_dim,
                                        c.ssm_state_size), F32),
                    "conv": jnp.zeros((rows, CONV_KERNEL - 1, c.mamba2_d_xbc), F32),
                })  # fmt: skip
        return {"kv": kv, "ssm": ssm}

    # -- arena access ----------------------------------------------------------------------------

    def _put(self, arena, name: str, value: jax.Array) -> jax.Array:
        """Stores `value` in region `name` as bf16 (the seed sizes activations for bf16)."""
        return self.plan.write(arena, name, value.astype(BF16))

    def _get(self, arena, name: str, shape: tuple[int, ...]) -> jax.Array:
        """Reads bf16 `shape` from the start of region `name`, as float32."""
        return self.plan.view(arena, name, shape, BF16).astype(F32)

    def _linear(self, arena, src: str, shape, w: Any, regions, *, quant: bool = False):
        """`x @ w` for `x` = region `src` (`shape = (T, K)`); see the module docstring.

        `regions` are the FP8 buffers the input is quantized into when a part of `w` is FP8 (or
        `quant`); None means they cannot hold this K (then the bf16 input is used as stored and
        FP8 weights are dequantized). Returns `(arena, float32[T, sum of outputs])`.
        """
        t, k = shape
        parts = _parts(w)
        if (quant or any(_is_fp8(p) for p in parts)) and regions is not None:
            x = self.plan.view(arena, src, shape, BF16)
            arena = fp8_block_quant_into(arena, self.plan, x, regions=regions,
                                         interpret=self.interpret)  # fmt: skip
            rows, nb = workspaces.fp8_rows(t), workspaces.fp8_scale_cols(k)
            q = self.plan.view(arena, regions[0], (rows, k), jnp.float8_e4m3fn)[:t]
            s = self.plan.view(arena, regions[1], (rows, nb), F32)[:t]
            xd = None
            outs = []
            for p in parts:
                if _is_fp8(p):
                    outs.append(fp8_block_matmul(q, s, p))
                else:
                    if xd is None:
                        xd = q.astype(F32) * jnp.repeat(s, workspaces.FP8_BLOCK, axis=1)[:, :k]
                    outs.append(xd @ p.astype(F32))
        else:
            x = self._get(arena, src, shape)
            outs = [x @ (_dequant_weight(p) if _is_fp8(p) else p.astype(F32)) for p in parts]
        return arena, outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)

    def _hidden_regions(self, k: int):
        """The FP8 buffers for a projection whose input width is `k` (hidden, q width, Mamba
        d_inner): the projections' `fp8_act` group."""
        return workspaces.FP8_ACT_REGIONS

    # -- blocks --------------------------------------------------------------------------------

    def _mlp(self, arena, p, t: int):
        """norm_output -> up (and gate) -> activation -> down -> `moe_output`."""
        c, a = self.config, self.arch
        h, inter = c.hidden_size, c.intermediate_size
        quant = a.fp8_mlp_acts
        if a.mlp == "swiglu":
            arena, g = self._linear(arena, "norm_output", (t, h), p["w_gate"],
                                    workspaces.FP8_ACT_REGIONS, quant=quant)  # fmt: skip
            arena = self._put(arena, "expert_gate_out", g)
            # The up projection reuses the same quantized input (the FP8 buffers still hold it
            # when the gate's weights are FP8), but re-quantizing keeps the dataflow simple.
            arena, u = self._linear(arena, "norm_output", (t, h), p["w_up"],
                                    workspaces.FP8_ACT_REGIONS, quant=quant)  # fmt: skip
            arena = self._put(arena, "expert_up_out", u)
            g = self._get(arena, "expert_gate_out", (t, inter))
            u = self._get(arena, "expert_up_out", (t, inter))
            arena = self._put(arena, "expert_up_out", jax.nn.silu(g) * u)
        else:
            arena, up = self._linear(arena, "norm_output", (t, h), p["w_up"],
                                     workspaces.FP8_ACT_REGIONS, quant=quant)  # fmt: skip
            arena = self._put(arena, "expert_up_out", jnp.square(jax.nn.relu(up)))
        # The seed's floor(K / 128) k-major scales cannot hold ceil(K / 128) columns when the
        # intermediate size is not a multiple of 128: that projection reads its bf16 input.
        regions = FFN_QUANT_REGIONS if workspaces.ffn_fp8_uses_seed_regions(inter) else None
        arena, down = self._linear(arena, "expert_up_out", (t, inter), p["w_down"], regions,
                                   quant=quant)  # fmt: skip
        arena = self._put(arena, "moe_output", down)
        return arena, self._get(arena, "moe_output", (t, h))

    def _zxbcdt(self, arena, t: int):
        """The Mamba-2 in_proj output in `ssm_qkvz`, split into z, xBC and dt."""
        c = self.config
        zx = self._get(arena, "ssm_qkvz", (t, c.mamba2_in_proj_size))
        d_in, d_xbc = c.mamba2_d_inner, c.mamba2_d_xbc
        return zx[:, :d_in], zx[:, d_in : d_in + d_xbc], zx[:, d_in + d_xbc :]

    def _mamba_in(self, arena, p, t: int):
        c = self.config
        arena, zx = self._linear(arena, "norm_output", (t, c.hidden_size), p["in_proj"],
                                 self._hidden_regions(c.hidden_size))  # fmt: skip
        return self._put(arena, "ssm_qkvz", zx)

    def _mamba_out(self, arena, p, y, t: int):
        """Gate y with silu(z), grouped RMSNorm, `attn_output`, out_proj."""
        c = self.config
        z, _, _ = self._zxbcdt(arena, t)
        y = y.reshape(t, c.mamba2_d_inner) * jax.nn.silu(z)
        g = c.n_groups
        y = _rms(y.reshape(t, g, -1), p["gate_norm"].reshape(g, -1), self.arch.rms_eps)
        arena = self._put(arena, "attn_output", y.reshape(t, -1))
        return self._linear(arena, "attn_output", (t, c.mamba2_d_inner), p["out_proj"],
                            self._hidden_regions(c.mamba2_d_inner))  # fmt: skip

    def _split_xbc(self, xbc):
        c = self.config
        t = xbc.shape[0]
        d_in, gn = c.mamba2_d_inner, c.n_groups * c.ssm_state_size
        x = xbc[:, :d_in].reshape(t, c.mamba_num_heads, c.mamba_head_dim)
        b = xbc[:, d_in : d_in + gn].reshape(t, c.n_groups, c.ssm_state_size)
        cc = xbc[:, d_in + gn :].reshape(t, c.n_groups, c.ssm_state_size)
        return x, b, cc

    def _qkv(self, arena, p, t: int, positions):
        """QKV projection into `qkv_output`; returns (arena, q, k, v) with q/k norm and RoPE."""
        c, a = self.config, self.arch
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        arena, qkv = self._linear(arena, "norm_output", (t, c.hidden_size), p["wqkv"],
                                  self._hidden_regions(c.hidden_size))  # fmt: skip
        arena = self._put(arena, "qkv_output", qkv)
        qkv = self._get(arena, "qkv_output", (t, (hq + 2 * hkv) * hd))
        q = qkv[:, : hq * hd].reshape(t, hq, hd)
        k = qkv[:, hq * hd : (hq + hkv) * hd].reshape(t, hkv, hd)
        v = qkv[:, (hq + hkv) * hd :].reshape(t, hkv, hd)
        if a.qk_norm:
            q, k = _rms(q, p["q_norm"], a.rms_eps), _rms(k, p["k_norm"], a.rms_eps)
        if a.rope:
            q, k = _rope(q, positions, a.rope_theta), _rope(k, positions, a.rope_theta)
        return arena, q, k, v

    def _attn_out(self, arena, p, t: int):
        c = self.config
        hq_d = c.num_attention_heads * c.head_dim
        return self._linear(arena, "attn_output", (t, hq_d), p["wo"], self._hidden_regions(hq_d))

    def _append_kv(self, cache, k, v, block_tables, seq_ids, positions):
        bs = self.kv_block_size
        slots = block_tables[seq_ids, positions // bs] * bs + positions % bs
        nb, _, hkv, hd = cache["k"].shape
        flat = lambda a: a.reshape(nb * bs, hkv, hd)  # noqa: E731
        return {
            "k": flat(cache["k"]).at[slots].set(k.astype(BF16)).reshape(cache["k"].shape),
            "v": flat(cache["v"]).at[slots].set(v.astype(BF16)).reshape(cache["v"].shape),
        }

    def _block_start(self, arena, p, t: int):
        """Copies the skip path to `residual` and writes the pre-norm to `norm_output`."""
        h_shape = (t, self.config.hidden_size)
        arena = self._put(arena, "residual", self._get(arena, "hidden_states", h_shape))
        return self._put(arena, "norm_output", _rms(self._get(arena, "hidden_states", h_shape),
                                                     p["norm"], self.arch.rms_eps))  # fmt: skip

    def _block_end(self, arena, out, t: int):
        resid = self._get(arena, "residual", (t, self.config.hidden_size))
        return self._put(arena, "hidden_states", resid + out)

    def _lm_head(self, arena, params, rows, t: int):
        """Final norm and LM head of the hidden rows `rows` (indices) into `logits`."""
        c = self.config
        h = self._get(arena, "hidden_states", (t, c.hidden_size))[rows]
        h = _rms(h, params["final_norm"], self.arch.rms_eps)
        head = params["embed"].T if self.arch.tie_embeddings else params["lm_head"]
        arena = self._put(arena, "logits", h @ head.astype(F32))
        return arena, self._get(arena, "logits", (rows.shape[0], c.vocab_size))

    # -- prefill -------------------------------------------------------------------------------

    def prefill(self, params, arena, caches, tokens, cu_seqlens, block_tables, *,
                all_logits: bool = False):  # fmt: skip
        """Runs the prompts of `S` sequences packed into one pass.

        Args:
          params: the weights (see the module docstring; `layers` holds one dict per block).
          arena: the plan's arena (donated).
          caches: `init_caches(...)` (donated); sequence `s` uses SSM cache row `s` and the KV
            blocks of `block_tables[s]`.
          tokens: `int32[T]`, the prompts back to back, `T <= max_batch_tokens`.
          cu_seqlens: `int32[S + 1]`, sequence `s` is `tokens[cu_seqlens[s]:cu_seqlens[s+1]]`
            (every sequence at least one token).
          block_tables: `int32[S, max_blocks_per_seq]`.
          all_logits: static; return the logits of every token instead of each sequence's last.

        Returns:
          `(arena, caches, logits)`: `float32[S, vocab]` (each sequence's last prompt token),
          or `float32[T, vocab]` with `all_logits`; the values are those stored (bf16) in the
          arena's `logits` region.
        """
        c, a = self.config, self.arch
        t = tokens.shape[0]
        s = cu_seqlens.shape[0] - 1
        if t > self.max_batch_tokens:
            raise ValueError(f"{t} prompt tokens exceed max_batch_tokens={self.max_batch_tokens}")
        idx = jnp.arange(t, dtype=jnp.int32)
        # Each token's sequence: how many sequence ends are <= it. A count, as in the SSD scan,
        # not `searchsorted`, whose default method is a while loop of log2(S) steps on a GPU.
        seq = jnp.sum(cu_seqlens[None, 1:] <= idx[:, None], axis=1, dtype=jnp.int32)
        positions = idx - cu_seqlens[seq]
        arena = self._put(arena, "hidden_states", params["embed"][tokens])
        kv, ssm = list(caches["kv"]), list(caches["ssm"])
        ia = im = 0
        for kind, p in zip(a.blocks, params["layers"], strict=True):
            arena = self._block_start(arena, p, t)
            if kind == "mlp":
                arena, out = self._mlp(arena, p, t)
            elif kind == "attention":
                arena, q, k, v = self._qkv(arena, p, t, positions)
                kv[ia] = self._append_kv(kv[ia], k, v, block_tables, seq, positions)
                # Prefill attention reads what decode reads: bf16 queries and the bf16 cache.
                q, k, v = (x.astype(BF16).astype(F32) for x in (q, k, v))
                g = c.num_attention_heads // c.num_key_value_heads
                kk, vv = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
                logits = jnp.einsum("thd,uhd->htu", q, kk) / math.sqrt(c.head_dim)
                mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
                probs = jax.nn.softmax(jnp.where(mask[None], logits, -jnp.inf), axis=-1)
                o = jnp.einsum("htu,uhd->thd", probs, vv).reshape(t, -1)
                kv[ia], arena = jax.lax.optimization_barrier((kv[ia], arena))
                arena = self._put(arena, "attn_output", o)
                arena, out = self._attn_out(arena, p, t)
                ia += 1
            else:
                arena = self._mamba_in(arena, p, t)
                _, xbc_in, _ = self._zxbcdt(arena, t)
                # Causal depthwise conv within each sequence: tap j reads token t - j.
                conv = p["conv_b"] + xbc_in * p["conv_w"][CONV_KERNEL - 1]
                for j in range(1, CONV_KERNEL):
                    prev = jnp.roll(xbc_in, j, axis=0)
                    same = (idx >= j) & (jnp.roll(seq, j) == seq)
                    conv = (
                        conv
                        + jnp.where(same[:, None], prev, 0.0) * p["conv_w"][CONV_KERNEL - 1 - j]
                    )
                # The conv window decode starts from: the last 3 pre-conv inputs of each
                # sequence (zeros before its start).
                win = []
                for j in range(CONV_KERNEL - 1, 0, -1):
                    pos = cu_seqlens[1:] - j
                    ok = pos >= cu_seqlens[:-1]
                    win.append(jnp.where(ok[:, None], xbc_in[jnp.maximum(pos, 0)], 0.0))
                conv_cache = ssm[im]["conv"].at[:s].set(jnp.stack(win, 1))
                conv_cache, arena = jax.lax.optimization_barrier((conv_cache, arena))
                arena = self._put(arena, "ssm_deinterleaved", jax.nn.silu(conv))
                xbc = self._get(arena, "ssm_deinterleaved", (t, c.mamba2_d_xbc))
                x, b, cc = self._split_xbc(xbc)
                _, _, dt = self._zxbcdt(arena, t)
                arena, y, final = ssd_chunked_scan_into(
                    arena, self.plan, x.astype(BF16), dt, -jnp.exp(p["A_log"].astype(F32)), b,
                    cc, D=p["D"].astype(F32), dt_bias=p["dt_bias"].astype(F32),
                    dt_softplus=True, cu_seqlens=cu_seqlens, interpret=self.interpret,
                )  # fmt: skip
                ssm[im] = {"state": ssm[im]["state"].at[:s].set(final), "conv": conv_cache}
                ssm[im], arena = jax.lax.optimization_barrier((ssm[im], arena))
                im += 1
                arena, out = self._mamba_out(arena, p, y.astype(F32), t)
            arena = self._block_end(arena, out, t)
        rows = idx if all_logits else cu_seqlens[1:] - 1
        arena, logits = self._lm_head(arena, params, rows, t)
        return arena, {"kv": kv, "ssm": ssm}, logits

    # -- decode --------------------------------------------------------------------------------

    def decode_step(self, params, arena, caches, tokens, positions, block_tables, seq_lens):
        """One decode step for `B` sequences (one new token each).

        Args:
          params: as for `prefill`.
          arena, caches: donated; sequence `b` uses SSM cache row `b`.
          tokens: `int32[B]`, the newest token of each sequence.
          positions: `int32[B]`, its position (the sequence length before this token).
          block_tables: `int32[B, max_blocks_per_seq]`.
          seq_lens: `int32[B]`, lengths after this token (`positions + 1`).

        Returns:
          `(arena, caches, logits float32[B, vocab], next_tokens int32[B])` (greedy).
        """
        c, a = self.config, self.arch
        bsz = tokens.shape[0]
        seq = jnp.arange(bsz, dtype=jnp.int32)
        arena = self._put(arena, "hidden_states", params["embed"][tokens])
        kv, ssm = list(caches["kv"]), list(caches["ssm"])
        ia = im = 0
        for kind, p in zip(a.blocks, params["layers"], strict=True):
            arena = self._block_start(arena, p, bsz)
            if kind == "mlp":
                arena, out = self._mlp(arena, p, bsz)
            elif kind == "attention":
                arena, q, k, v = self._qkv(arena, p, bsz, positions)
                kv[ia] = self._append_kv(kv[ia], k, v, block_tables, seq, positions)
                arena = splitk_decode_attention_into(
                    arena, self.plan, q.astype(BF16), kv[ia]["k"], kv[ia]["v"], block_tables,
                    seq_lens, levers=self.levers, target=self.target, interpret=self.interpret,
                )  # fmt: skip
                arena, out = self._attn_out(arena, p, bsz)
                ia += 1
            else:
                arena = self._mamba_in(arena, p, bsz)
                _, xbc_in, _ = self._zxbcdt(arena, bsz)
                window = jnp.concatenate([ssm[im]["conv"][:bsz], xbc_in[:, None, :]], axis=1)
                conv = p["conv_b"] + jnp.einsum("bkd,kd->bd", window, p["conv_w"].astype(F32))
                conv_cache = ssm[im]["conv"].at[:bsz].set(window[:, 1:])
                conv_cache, arena = jax.lax.optimization_barrier((conv_cache, arena))
                arena = self._put(arena, "ssm_deinterleaved", jax.nn.silu(conv))
                x, b, cc = self._split_xbc(self._get(arena, "ssm_deinterleaved",
                                                     (bsz, c.mamba2_d_xbc)))  # fmt: skip
                _, _, dt = self._zxbcdt(arena, bsz)
                # The decode-step kernel updates rows 0..bsz-1 of the (donated) state cache in
                # place, B and C per group, softplus(dt + dt_bias) as in the prefill scan.
                y, state = ssd_state_update(
                    ssm[im]["state"], x, dt, -jnp.exp(p["A_log"].astype(F32)), b, cc,
                    D=p["D"].astype(F32), dt_bias=p["dt_bias"].astype(F32), dt_softplus=True,
                    interpret=self.interpret,
                )  # fmt: skip
                ssm[im] = {"state": state, "conv": conv_cache}
                ssm[im], arena = jax.lax.optimization_barrier((ssm[im], arena))
                im += 1
                arena, out = self._mamba_out(arena, p, y.astype(BF16).astype(F32), bsz)
            arena = self._block_end(arena, out, bsz)
        arena, logits = self._lm_head(arena, params, seq, bsz)
        return arena, {"kv": kv, "ssm": ssm}, logits, jnp.argmax(logits, -1).astype(jnp.int32)

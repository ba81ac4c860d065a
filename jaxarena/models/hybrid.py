"""A small but real hybrid language model that runs every step on one fixed arena.

Layers follow the config's `layer_types` (a Nemotron-H-shaped preset, `tiny-hybrid`, by
default):
- `"mamba"`: Mamba-2 mixer. in_proj -> causal depthwise conv1d (kernel 4) -> SSD scan
  (prefill: the `ssd_chunked_scan` Pallas kernel with its scratch in `ssd_scratch`; decode:
  the one-step state update) -> gate with silu(z) -> grouped RMSNorm -> out_proj.
- attention (`"full_attention"`, ...): GQA with RoPE and a paged KV cache (vLLM layout).
  Prefill attends densely within each packed sequence; decode runs the split-K Pallas kernel
  with its partials in `splitk_workspace` and its output in `attn_output`.
- `"mlp"`: relu^2 MLP whose two projections quantize their input activations with the FP8
  block kernel (1 x 128 blocks) into `fp8_act*` (K = hidden) and `ffn_act_*`
  (K = intermediate) and multiply the dequantized values.
RMSNorm before every block, residual adds, a final norm and an LM head.

Every intermediate the seed gives a buffer for is written to and read back from the arena at
the plan's offsets (`hidden_states`, `residual`, `norm_output`, `qkv_output`, `attn_output`,
`ssm_qkvz`, `ssm_deinterleaved`, `expert_up_out`, `moe_output`, `logits`, the FP8 buffers,
`splitk_workspace`, `ssd_scratch`). Stored activations are bfloat16, as the seed sizes them;
arithmetic is float32.

`prefill` and `decode_step` are pure; jit them with the arena and the caches donated
(`jax.jit(model.prefill, donate_argnums=(1, 2))`), so every step runs in the same device buffers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, ServeLimits, Target, workspaces
from pallas_kernels import (
    fp8_block_quant_into,
    splitk_decode_attention_into,
    ssd_chunked_scan_into,
)

__all__ = ["HybridModel", "init_params", "init_caches", "ATTENTION", "MAMBA", "MLP"]

ATTENTION = frozenset({"full_attention", "sliding_attention", "attention"})
MAMBA = frozenset({"mamba"})
MLP = frozenset({"mlp"})
BF16 = jnp.bfloat16
F32 = jnp.float32
CONV_KERNEL = 4
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
# The FFN down projection quantizes into the dense-FFN activation buffers (when its K, the
# intermediate size, is a multiple of 128; see `workspaces.ffn_fp8_uses_seed_regions`).
FFN_QUANT_REGIONS = ("ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor")


def _kind(layer_type: str) -> str:
    if layer_type in ATTENTION:
        return "attention"
    if layer_type in MAMBA:
        return "mamba"
    if layer_type in MLP:
        return "mlp"
    raise NotImplementedError(
        f"the reference hybrid model has no {layer_type!r} layers (attention, mamba, mlp only)"
    )


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random weights for `config` from `seed` (float32; scaled to keep activations O(1))."""
    h, v = config.hidden_size, config.vocab_size
    keys = iter(jax.random.split(jax.random.key(seed), 8 * len(config.layer_types) + 4))

    def dense(fan_in: int, fan_out: int) -> jax.Array:
        return jax.random.normal(next(keys), (fan_in, fan_out), F32) / math.sqrt(fan_in)

    layers = []
    for lt in config.layer_types:
        kind = _kind(lt)
        p: dict[str, jax.Array] = {"norm": 1.0 + 0.1 * jax.random.normal(next(keys), (h,), F32)}
        if kind == "attention":
            hq, hkv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            p["wqkv"] = dense(h, (hq + 2 * hkv) * hd)
            p["wo"] = dense(hq * hd, h)
        elif kind == "mamba":
            nh, d_in, d_xbc = config.mamba_num_heads, config.mamba2_d_inner, config.mamba2_d_xbc
            p["in_proj"] = dense(h, config.mamba2_in_proj_size)
            p["conv_w"] = jax.random.normal(next(keys), (CONV_KERNEL, d_xbc), F32) * 0.5
            p["conv_b"] = jax.random.normal(next(keys), (d_xbc,), F32) * 0.1
            p["dt_bias"] = jax.random.uniform(next(keys), (nh,), F32, -3.0, -1.0)
            p["A_log"] = jnp.log(jax.random.uniform(next(keys), (nh,), F32, 1.0, 8.0))
            p["D"] = jnp.ones((nh,), F32)
            p["gate_norm"] = jnp.ones((d_in,), F32)
            p["out_proj"] = dense(d_in, h)
        else:
            p["w_up"] = dense(h, config.intermediate_size)
            p["w_down"] = dense(config.intermediate_size, h) * 0.5
        layers.append(p)
    return {
        "embed": jax.random.normal(next(keys), (v, h), F32),
        "layers": layers,
        "final_norm": jnp.ones((h,), F32),
        "lm_head": dense(h, v),
    }


def init_caches(
    config: ModelConfig, *, num_blocks: int, block_size: int, max_batch_size: int
) -> dict[str, Any]:
    """Zeroed decode caches: a paged bf16 KV cache per attention layer
    (`[num_blocks, block_size, Hkv, D]`), and per Mamba layer the f32 SSM state
    (`[max_batch_size, H, P, N]`) and the conv window (`[max_batch_size, 3, d_xbc]`)."""
    kv, ssm = [], []
    for lt in config.layer_types:
        kind = _kind(lt)
        if kind == "attention":
            shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
            kv.append({"k": jnp.zeros(shape, BF16), "v": jnp.zeros(shape, BF16)})
        elif kind == "mamba":
            ssm.append({
                "state": jnp.zeros((max_batch_size, config.mamba_num_heads,
                                    config.mamba_head_dim, config.ssm_state_size), F32),
                "conv": jnp.zeros((max_batch_size, CONV_KERNEL - 1, config.mamba2_d_xbc), F32),
            })  # fmt: skip
    return {"kv": kv, "ssm": ssm}


def _rms(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + RMS_EPS) * w


def _rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary embedding (rotate-half form) of `x [T, heads, D]` at `positions [T]`."""
    d = x.shape[-1]
    inv = ROPE_THETA ** (-jnp.arange(0, d // 2, dtype=F32) * 2 / d)
    ang = positions.astype(F32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridModel:
    """The reference hybrid model bound to one arena plan.

    Attributes:
      config: the model (attention / mamba / mlp layers).
      plan: the arena layout, from `BufferSizes.from_config` at the serve limits (or packed).
      max_batch_tokens, max_seq_len, kv_block_size, max_batch_size: the serve limits the plan
        was sized for.
      target, levers: what sized the split-K workspace; the decode kernel uses the same policy.
      interpret: Pallas interpret mode (None: on CPU).
    """

    config: ModelConfig
    plan: ArenaPlan
    max_batch_tokens: int
    max_seq_len: int
    kv_block_size: int
    max_batch_size: int
    target: Target
    levers: Levers
    interpret: bool | None = None

    @classmethod
    def create(
        cls,
        config: ModelConfig,
        *,
        max_batch_tokens: int,
        max_seq_len: int,
        kv_block_size: int = 16,
        max_batch_size: int = 8,
        target: Target | None = None,
        levers: Levers | None = None,
        guard_bytes: int = 0,
        plan: ArenaPlan | None = None,
        interpret: bool | None = None,
    ) -> HybridModel:
        """Sizes the arena for `config` at these limits and returns the model bound to it.

        `target` defaults to `gb10` and `levers` to none set, so the plan does not depend on
        the machine or the environment; pass `plan=` to run on a plan of your own (e.g. a
        packed one built from the same sizes).
        """
        for lt in config.layer_types:
            _kind(lt)
        if config.num_experts:
            raise NotImplementedError("the reference hybrid model has no MoE layers")
        target = target or Target.preset("gb10")
        levers = levers or Levers()
        if plan is None:
            limits = ServeLimits(max_batch_tokens=max_batch_tokens, max_seq_len=max_seq_len,
                                 kv_block_size=kv_block_size, max_batch_size=max_batch_size)
            sizes = BufferSizes.from_config(config, limits, levers=levers, target=target)
            plan = ArenaPlan.sequential(sizes, guard_bytes=guard_bytes)
        return cls(config=config, plan=plan, max_batch_tokens=max_batch_tokens,
                   max_seq_len=max_seq_len, kv_block_size=kv_block_size,
                   max_batch_size=max_batch_size, target=target, levers=levers,
                   interpret=interpret)  # fmt: skip

    # -- blocks --------------------------------------------------------------------------------
    #
    # Arena discipline (what keeps every write in place): XLA orders in-place updates by data
    # dependencies only, so a value viewed from the arena must be consumed by what produces
    # the NEXT arena write; a view of an older arena version consumed later would make XLA
    # copy the whole arena. So each block re-reads what it needs (`_get`) from the newest
    # arena right where it uses it, and results that leave the arena (the caches) are tied to
    # it with `lax.optimization_barrier` before the next write.

    def _put(self, arena, name: str, value: jax.Array) -> jax.Array:
        """Stores `value` in region `name` as bf16 (the seed sizes activations for bf16)."""
        return self.plan.write(arena, name, value.astype(BF16))

    def _get(self, arena, name: str, shape: tuple[int, ...]) -> jax.Array:
        """Reads bf16 `shape` from the start of region `name`, as float32."""
        return self.plan.view(arena, name, shape, BF16).astype(F32)

    def _fp8_matmul(self, arena, src: str, shape, w: jax.Array, regions) -> tuple[Any, jax.Array]:
        """`x @ w` for `x` = region `src`, quantized to FP8 1x128 blocks into `regions`."""
        t, k = shape
        x = self.plan.view(arena, src, shape, BF16)
        arena = fp8_block_quant_into(arena, self.plan, x, regions=regions,
                                     interpret=self.interpret)  # fmt: skip
        rows, nb = workspaces.fp8_rows(t), workspaces.fp8_scale_cols(k)
        q = self.plan.view(arena, regions[0], (rows, k), jnp.float8_e4m3fn)[:t]
        s = self.plan.view(arena, regions[1], (rows, nb), F32)[:t]
        block = workspaces.FP8_BLOCK
        return arena, (q.astype(F32) * jnp.repeat(s, block, axis=1)[:, :k]) @ w

    def _mlp(self, arena, p, t: int):
        """norm_output -> FP8 up -> relu^2 -> FP8 down -> `moe_output`."""
        c = self.config
        arena, up = self._fp8_matmul(arena, "norm_output", (t, c.hidden_size), p["w_up"],
                                     workspaces.FP8_ACT_REGIONS)  # fmt: skip
        arena = self._put(arena, "expert_up_out", jnp.square(jax.nn.relu(up)))
        if workspaces.ffn_fp8_uses_seed_regions(c.intermediate_size):
            arena, down = self._fp8_matmul(arena, "expert_up_out", (t, c.intermediate_size),
                                           p["w_down"], FFN_QUANT_REGIONS)  # fmt: skip
        else:
            # The seed's floor(K / 128) k-major scales cannot hold this K's ceil(K / 128)
            # columns: the down projection reads its bf16 input as stored.
            down = self._get(arena, "expert_up_out", (t, c.intermediate_size)) @ p["w_down"]
        arena = self._put(arena, "moe_output", down)
        return arena, self._get(arena, "moe_output", (t, c.hidden_size))

    def _zxbcdt(self, arena, t: int):
        """The Mamba-2 in_proj output in `ssm_qkvz`, split into z, xBC and dt."""
        c = self.config
        zx = self._get(arena, "ssm_qkvz", (t, c.mamba2_in_proj_size))
        d_in, d_xbc = c.mamba2_d_inner, c.mamba2_d_xbc
        return zx[:, :d_in], zx[:, d_in : d_in + d_xbc], zx[:, d_in + d_xbc :]

    def _mamba_out(self, arena, p, y, t: int):
        """Gate y with silu(z), grouped RMSNorm, `attn_output`, out_proj."""
        c = self.config
        z, _, _ = self._zxbcdt(arena, t)
        y = y.reshape(t, c.mamba2_d_inner) * jax.nn.silu(z)
        g = c.n_groups
        y = _rms(y.reshape(t, g, -1), p["gate_norm"].reshape(g, -1)).reshape(t, -1)
        arena = self._put(arena, "attn_output", y)
        return arena, self._get(arena, "attn_output", (t, c.mamba2_d_inner)) @ p["out_proj"]

    def _split_xbc(self, xbc):
        c = self.config
        t = xbc.shape[0]
        d_in, gn = c.mamba2_d_inner, c.n_groups * c.ssm_state_size
        x = xbc[:, :d_in].reshape(t, c.mamba_num_heads, c.mamba_head_dim)
        b = xbc[:, d_in : d_in + gn].reshape(t, c.n_groups, c.ssm_state_size)
        cc = xbc[:, d_in + gn :].reshape(t, c.n_groups, c.ssm_state_size)
        return x, b, cc

    def _qkv(self, arena, p, t: int, positions):
        """QKV projection into `qkv_output`; returns (arena, q, k, v) with RoPE applied."""
        c = self.config
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        n = self._get(arena, "norm_output", (t, c.hidden_size))
        arena = self._put(arena, "qkv_output", n @ p["wqkv"])
        qkv = self._get(arena, "qkv_output", (t, (hq + 2 * hkv) * hd))
        q = _rope(qkv[:, : hq * hd].reshape(t, hq, hd), positions)
        k = _rope(qkv[:, hq * hd : (hq + hkv) * hd].reshape(t, hkv, hd), positions)
        v = qkv[:, (hq + hkv) * hd :].reshape(t, hkv, hd)
        return arena, q, k, v

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
                                                     p["norm"]))  # fmt: skip

    def _block_end(self, arena, out, t: int):
        resid = self._get(arena, "residual", (t, self.config.hidden_size))
        return self._put(arena, "hidden_states", resid + out)

    def _lm_head(self, arena, params, rows, t: int):
        """Final norm and LM head of the hidden rows `rows` (indices) into `logits`."""
        c = self.config
        h = self._get(arena, "hidden_states", (t, c.hidden_size))[rows]
        arena = self._put(arena, "logits", _rms(h, params["final_norm"]) @ params["lm_head"])
        return arena, self._get(arena, "logits", (rows.shape[0], c.vocab_size))

    # -- prefill -------------------------------------------------------------------------------

    def prefill(self, params, arena, caches, tokens, cu_seqlens, block_tables):
        """Runs the prompts of `S` sequences packed into one pass.

        Args:
          params: `init_params(config)`.
          arena: the plan's arena (donated).
          caches: `init_caches(...)` (donated); sequence `s` uses SSM cache row `s` and the KV
            blocks of `block_tables[s]`.
          tokens: `int32[T]`, the prompts back to back, `T <= max_batch_tokens`.
          cu_seqlens: `int32[S + 1]`, sequence `s` is `tokens[cu_seqlens[s]:cu_seqlens[s+1]]`
            (every sequence at least one token).
          block_tables: `int32[S, max_blocks_per_seq]`.

        Returns:
          `(arena, caches, logits)`: the next-token logits `float32[S, vocab]` of each
          sequence's last prompt token.
        """
        c = self.config
        t = tokens.shape[0]
        s = cu_seqlens.shape[0] - 1
        if t > self.max_batch_tokens:
            raise ValueError(f"{t} prompt tokens exceed max_batch_tokens={self.max_batch_tokens}")
        idx = jnp.arange(t, dtype=jnp.int32)
        seq = jnp.searchsorted(cu_seqlens[1:], idx, side="right").astype(jnp.int32)
        positions = idx - cu_seqlens[seq]
        arena = self._put(arena, "hidden_states", params["embed"][tokens])
        kv, ssm = list(caches["kv"]), list(caches["ssm"])
        ia = im = 0
        for lt, p in zip(c.layer_types, params["layers"], strict=True):
            kind = _kind(lt)
            arena = self._block_start(arena, p, t)
            if kind == "mlp":
                arena, out = self._mlp(arena, p, t)
            elif kind == "attention":
                arena, q, k, v = self._qkv(arena, p, t, positions)
                kv[ia] = self._append_kv(kv[ia], k, v, block_tables, seq, positions)
                # Prefill attention reads what decode reads: bf16 queries and the bf16 cache.
                q, k, v = (a.astype(BF16).astype(F32) for a in (q, k, v))
                g = c.num_attention_heads // c.num_key_value_heads
                kk, vv = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
                logits = jnp.einsum("thd,uhd->htu", q, kk) / math.sqrt(c.head_dim)
                mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
                probs = jax.nn.softmax(jnp.where(mask[None], logits, -jnp.inf), axis=-1)
                o = jnp.einsum("htu,uhd->thd", probs, vv).reshape(t, -1)
                kv[ia], arena = jax.lax.optimization_barrier((kv[ia], arena))
                arena = self._put(arena, "attn_output", o)
                out = self._get(arena, "attn_output", o.shape) @ p["wo"]
                ia += 1
            else:
                n = self._get(arena, "norm_output", (t, c.hidden_size))
                arena = self._put(arena, "ssm_qkvz", n @ p["in_proj"])
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
                    arena, self.plan, x.astype(BF16), dt, -jnp.exp(p["A_log"]), b, cc,
                    D=p["D"], dt_bias=p["dt_bias"], dt_softplus=True, cu_seqlens=cu_seqlens,
                    interpret=self.interpret,
                )  # fmt: skip
                ssm[im] = {"state": ssm[im]["state"].at[:s].set(final), "conv": conv_cache}
                ssm[im], arena = jax.lax.optimization_barrier((ssm[im], arena))
                im += 1
                arena, out = self._mamba_out(arena, p, y.astype(F32), t)
            arena = self._block_end(arena, out, t)
        arena, logits = self._lm_head(arena, params, cu_seqlens[1:] - 1, t)
        return arena, {"kv": kv, "ssm": ssm}, logits

    # -- decode --------------------------------------------------------------------------------

    def decode_step(self, params, arena, caches, tokens, positions, block_tables, seq_lens):
        """One decode step for `B` sequences (one new token each).

        Args:
          tokens: `int32[B]`, the newest token of each sequence.
          positions: `int32[B]`, its position (the sequence length before this token).
          block_tables: `int32[B, max_blocks_per_seq]`.
          seq_lens: `int32[B]`, lengths after this token (`positions + 1`).

        Returns:
          `(arena, caches, logits float32[B, vocab], next_tokens int32[B])` (greedy).
        """
        c = self.config
        bsz = tokens.shape[0]
        seq = jnp.arange(bsz, dtype=jnp.int32)
        arena = self._put(arena, "hidden_states", params["embed"][tokens])
        kv, ssm = list(caches["kv"]), list(caches["ssm"])
        ia = im = 0
        for lt, p in zip(c.layer_types, params["layers"], strict=True):
            kind = _kind(lt)
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
                hq_d = c.num_attention_heads * c.head_dim
                out = self._get(arena, "attn_output", (bsz, hq_d)) @ p["wo"]
                ia += 1
            else:
                n = self._get(arena, "norm_output", (bsz, c.hidden_size))
                arena = self._put(arena, "ssm_qkvz", n @ p["in_proj"])
                _, xbc_in, _ = self._zxbcdt(arena, bsz)
                window = jnp.concatenate([ssm[im]["conv"][:bsz], xbc_in[:, None, :]], axis=1)
                conv = p["conv_b"] + jnp.einsum("bkd,kd->bd", window, p["conv_w"])
                conv_cache = ssm[im]["conv"].at[:bsz].set(window[:, 1:])
                conv_cache, arena = jax.lax.optimization_barrier((conv_cache, arena))
                arena = self._put(arena, "ssm_deinterleaved", jax.nn.silu(conv))
                x, b, cc = self._split_xbc(self._get(arena, "ssm_deinterleaved",
                                                     (bsz, c.mamba2_d_xbc)))  # fmt: skip
                _, _, dt = self._zxbcdt(arena, bsz)
                rep = c.mamba_num_heads // c.n_groups
                b, cc = jnp.repeat(b, rep, axis=1), jnp.repeat(cc, rep, axis=1)
                dtp = jax.nn.softplus(dt + p["dt_bias"])  # [B, H]
                decay = jnp.exp(dtp * -jnp.exp(p["A_log"]))
                state = ssm[im]["state"][:bsz] * decay[:, :, None, None] + (
                    dtp[:, :, None, None] * x[:, :, :, None] * b[:, :, None, :]
                )
                y = jnp.einsum("bhpn,bhn->bhp", state, cc) + p["D"][None, :, None] * x
                ssm[im] = {"state": ssm[im]["state"].at[:bsz].set(state), "conv": conv_cache}
                ssm[im], arena = jax.lax.optimization_barrier((ssm[im], arena))
                im += 1
                arena, out = self._mamba_out(arena, p, y.astype(BF16).astype(F32), bsz)
            arena = self._block_end(arena, out, bsz)
        arena, logits = self._lm_head(arena, params, seq, bsz)
        return arena, {"kv": kv, "ssm": ssm}, logits, jnp.argmax(logits, -1).astype(jnp.int32)


@functools.cache
def default_block_tables(batch: int, blocks_per_seq: int, seed: int = 0) -> np.ndarray:
    """A block table that gives each sequence `blocks_per_seq` pages in a shuffled order."""
    perm = np.random.default_rng(seed).permutation(batch * blocks_per_seq).astype(np.int32)
    return perm.reshape(batch, blocks_per_seq)

"""The reference hybrid model written plainly, in NumPy: no arena, no Pallas, no JAX; one
sequence at a time, contiguous KV caches, dense softmax attention, the sequential SSM
recurrence and a NumPy FP8 quantizer. It shares nothing with `jaxarena.models` but the
parameter layout (the dict `init_params` returns).

It rounds to bfloat16 at the same points where the arena model stores an activation in a
bf16 buffer, so the two agree up to float32 reassociation, and the bf16 / FP8 rounding flips
such differences occasionally cause.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32


def bf(x):
    """Round to bfloat16 and back: what storing in a bf16 buffer does."""
    return np.asarray(x, F32).astype(ml_dtypes.bfloat16).astype(F32)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x).astype(F32)


def rms(x, w, eps=1e-5):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w).astype(F32)


def rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    half = d // 2
    freqs = (theta ** (-np.arange(half, dtype=F32) * 2 / d)).astype(F32)
    ang = np.asarray(pos, F32)[:, None] * freqs[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    return np.concatenate([x[..., :half] * c - x[..., half:] * s,
                           x[..., half:] * c + x[..., :half] * s], axis=-1)  # fmt: skip


def fp8_quant_dequant(x, block=128):
    """1 x 128 block FP8 (e4m3fn) quantization and back; scale = max(amax, 1e-4) / 448."""
    t, k = x.shape
    nb = -(-k // block)
    xp = np.pad(x, ((0, 0), (0, nb * block - k))).reshape(t, nb, block)
    amax = np.max(np.abs(xp), axis=-1, keepdims=True)
    scale = (np.maximum(amax, F32(1e-4)) * F32(1 / 448)).astype(F32)
    q = np.clip(xp * (F32(1) / scale), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return (q.astype(F32) * scale).reshape(t, nb * block)[:, :k]


FP8_MODES = ("seed", "off", "all")


class PlainHybrid:
    """Same maths as `jaxarena.models.reference.hybrid.HybridModel`, written without the arena.

    `fp8` says which MLP projection inputs take the FP8 round trip: "seed" (the model's rule:
    the up projection always, the down projection when the intermediate size is a multiple of
    128), "off" (none) or "all" (both, whatever the size). The last two are the models the
    tests must tell apart from the arena model: one that skips FP8, one that does it where bf16
    is claimed.
    """

    def __init__(self, config, params, max_len, *, fp8: str = "seed"):
        if fp8 not in FP8_MODES:
            raise ValueError(f"fp8={fp8!r}: must be one of {FP8_MODES}")
        self.fp8 = fp8
        self.c = config
        self.p = {
            "embed": np.asarray(params["embed"]),
            "final_norm": np.asarray(params["final_norm"]),
            "lm_head": np.asarray(params["lm_head"]),
            "layers": [{k: np.asarray(v) for k, v in lp.items()} for lp in params["layers"]],
        }
        self.max_len = max_len

    def init_state(self, batch):
        c = self.c
        st = {"k": {}, "v": {}, "ssm": {}, "conv": {}}
        for i, lt in enumerate(c.layer_types):
            if lt == "full_attention":
                shape = (batch, self.max_len, c.num_key_value_heads, c.head_dim)
                st["k"][i], st["v"][i] = np.zeros(shape, F32), np.zeros(shape, F32)
            elif lt == "mamba":
                st["ssm"][i] = np.zeros((batch, c.mamba_num_heads, c.mamba_head_dim,
                                         c.ssm_state_size), F32)  # fmt: skip
                st["conv"][i] = np.zeros((batch, 3, c.mamba2_d_xbc), F32)
        return st

    def _mlp(self, p, n):
        up_in = n if self.fp8 == "off" else fp8_quant_dequant(n)
        up = bf(np.maximum(up_in @ p["w_up"], 0.0) ** 2)
        # The seed sizes the FFN k-major scales with floor(K / 128) columns, so a K that is not
        # a multiple of 128 stays bf16 (no FP8 round trip) for the down projection.
        down_fp8 = self.fp8 == "all" or (self.fp8 == "seed" and up.shape[-1] % 128 == 0)
        down_in = fp8_quant_dequant(up) if down_fp8 else up
        return bf(down_in @ p["w_down"])

    def _mamba(self, p, n, st, i, b):
        c = self.c
        d_in, d_xbc, nh, hp = c.mamba2_d_inner, c.mamba2_d_xbc, c.mamba_num_heads, c.mamba_head_dim
        g, ns = c.n_groups, c.ssm_state_size
        zxbcdt = bf(n @ p["in_proj"])
        z, xbc_in, dt = zxbcdt[:, :d_in], zxbcdt[:, d_in : d_in + d_xbc], zxbcdt[:, d_in + d_xbc :]
        a = -np.exp(p["A_log"])
        head_group = np.arange(nh) // (nh // g)
        win, h = st["conv"][i][b], st["ssm"][i][b]
        ys = []
        for t in range(n.shape[0]):
            full = np.concatenate([win, xbc_in[t][None]], 0)  # taps t-3 .. t
            win = full[1:]
            xbc = bf(silu(p["conv_b"] + np.sum(full * p["conv_w"], 0)))
            x = xbc[:d_in].reshape(nh, hp)
            bb = xbc[d_in : d_in + g * ns].reshape(g, ns)[head_group]
            cc = xbc[d_in + g * ns :].reshape(g, ns)[head_group]
            dtp = softplus(dt[t] + p["dt_bias"])
            h = (
                h * np.exp(dtp * a)[:, None, None]
                + dtp[:, None, None] * x[:, :, None] * bb[:, None]
            )
            ys.append(bf(np.einsum("hpn,hn->hp", h, cc) + p["D"][:, None] * x).reshape(d_in))
        st["conv"][i][b], st["ssm"][i][b] = win, h
        y = np.stack(ys) * silu(z)
        y = rms(y.reshape(-1, g, d_in // g), p["gate_norm"].reshape(g, -1)).reshape(-1, d_in)
        return bf(y) @ p["out_proj"]

    def _attention(self, p, n, st, i, b, start):
        c = self.c
        hq, hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        ln = n.shape[0]
        qkv = bf(n @ p["wqkv"])
        pos = np.arange(start, start + ln)
        q = bf(rope(qkv[:, : hq * hd].reshape(ln, hq, hd), pos))
        k = rope(qkv[:, hq * hd : (hq + hkv) * hd].reshape(ln, hkv, hd), pos)
        v = qkv[:, (hq + hkv) * hd :].reshape(ln, hkv, hd)
        st["k"][i][b, start : start + ln] = bf(k)
        st["v"][i][b, start : start + ln] = bf(v)
        kk = np.repeat(st["k"][i][b, : start + ln], hq // hkv, axis=1)  # [S, Hq, D]
        vv = np.repeat(st["v"][i][b, : start + ln], hq // hkv, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) / np.sqrt(F32(hd))
        causal = np.arange(start + ln)[None, :] <= (start + np.arange(ln))[:, None]
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("hts,shd->thd", probs, vv).reshape(ln, hq * hd)
        return bf(out) @ p["wo"]

    def forward(self, st, tokens, b, start):
        """Tokens `[L]` of sequence `b` at positions `start..`; float32 logits of the last."""
        h = bf(self.p["embed"][np.asarray(tokens)])
        for i, (lt, p) in enumerate(zip(self.c.layer_types, self.p["layers"], strict=True)):
            n = bf(rms(h, p["norm"]))
            if lt == "mlp":
                out = self._mlp(p, n)
            elif lt == "mamba":
                out = self._mamba(p, n, st, i, b)
            else:
                out = self._attention(p, n, st, i, b, start)
            h = bf(h + out)
        return bf(rms(h[-1:], self.p["final_norm"]) @ self.p["lm_head"])[0]

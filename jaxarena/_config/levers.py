"""`Levers`: the four environment switches the seed's sizing reads (spec §1, §7.2, §8, §9).

This module is the only place jaxarena reads the process environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from jaxarena._errors import ConfigError

__all__ = [
    "Levers",
    "ENV_GGUF_NATIVE_Q2",
    "ENV_GGUF_NATIVE_Q2_MMQ",
    "ENV_FP8_ROWWISE",
    "ENV_ATTN_DECODE_SPLITK",
]

ENV_GGUF_NATIVE_Q2 = "JAXARENA_GGUF_NATIVE_Q2"
ENV_GGUF_NATIVE_Q2_MMQ = "JAXARENA_GGUF_NATIVE_Q2_MMQ"
ENV_FP8_ROWWISE = "JAXARENA_FP8_ROWWISE"
ENV_ATTN_DECODE_SPLITK = "JAXARENA_ATTN_DECODE_SPLITK"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Levers:
    """Runtime switches that change buffer sizes.

    Attributes:
      gguf_native_q2: keep-packed Q2_0 prefill dequant scratch (`q2_dequant_scratch`).
      gguf_native_q2_mmq: keep-packed Q2_0 MMQ activation scratch (`q2_act_q8`).
      fp8_rowwise: row-wise FP8 GDN prefill BF16-weight slab (`ssm_rowwise_w_bf16`).
      attn_decode_splitk: the raw split-K policy spelling (`None` when unset). It is kept raw
        because a spelling that does not parse falls back to the target's declared policy
        (`Target.attn_decode_splitk`), which only the sizing call knows; see
        `jaxarena.splitk_policy`.
    """

    gguf_native_q2: bool = False
    gguf_native_q2_mmq: bool = False
    fp8_rowwise: bool = False
    attn_decode_splitk: str | None = None

    def __post_init__(self) -> None:
        for name in ("gguf_native_q2", "gguf_native_q2_mmq", "fp8_rowwise"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Levers.{name}={getattr(self, name)!r} must be a bool")
        if self.attn_decode_splitk is not None and not isinstance(self.attn_decode_splitk, str):
            raise ConfigError(
                f"Levers.attn_decode_splitk={self.attn_decode_splitk!r} must be a str or None"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Levers:
        """Reads the levers from `environ` (default `os.environ`) with the seed's semantics.

        The three boolean levers are on only when the variable is exactly the string `"1"`
        (`"true"`, `" 1"` and `"01"` are off). The split-K spelling is kept as given.
        """
        env = os.environ if environ is None else environ
        return cls(
            gguf_native_q2=env.get(ENV_GGUF_NATIVE_Q2) == "1",
            gguf_native_q2_mmq=env.get(ENV_GGUF_NATIVE_Q2_MMQ) == "1",
            fp8_rowwise=env.get(ENV_FP8_ROWWISE) == "1",
            attn_decode_splitk=env.get(ENV_ATTN_DECODE_SPLITK),
        )

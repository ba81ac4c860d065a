"""`CausalLM`'s process-wide executable cache is keyed by the full abstract signature of a
step: shapes AND dtypes of the arguments, and the static arguments bound to the step."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from lm_runs import CHECKPOINTS, LIMITS

from jaxarena.models import load_pretrained


def _probe(params, arena, caches, x, *, scale=1):
    # A step with CausalLM's calling convention: arena and caches pass through unchanged.
    return arena, caches, x * scale


def test_same_shapes_different_dtype_compile_separately():
    """A step run on float32 and then on int32 (and bf16) arguments of the same shape gets an
    executable of its own each time: keyed by shapes only, the second call would reuse the
    float32 executable (which rejects or misreads int32 arguments)."""
    lm = load_pretrained(CHECKPOINTS / "llama", **LIMITS)
    for dtype in (jnp.float32, jnp.int32, jnp.bfloat16):
        (y,) = lm._run("probe", _probe, jnp.full((3,), 2, dtype))
        assert y.dtype == dtype
        np.testing.assert_array_equal(np.asarray(y, np.float32), [2, 2, 2])
    assert sum(k[0] == "probe" for k in lm._compiled) == 3
    # The arena survives the donated round trips in place.
    assert lm.arena.unsafe_buffer_pointer() == lm.arena_pointer


def test_static_arguments_are_part_of_the_key():
    """Two equal partials share one executable; a different bound static argument (same
    kind, same argument types) does not."""
    lm = load_pretrained(CHECKPOINTS / "llama", **LIMITS)
    x = jnp.ones((4,), jnp.float32)
    (a,) = lm._run("scaled", functools.partial(_probe, scale=2), x)
    (b,) = lm._run("scaled", functools.partial(_probe, scale=2), x)
    (c,) = lm._run("scaled", functools.partial(_probe, scale=3), x)
    np.testing.assert_array_equal(np.asarray(a), [2, 2, 2, 2])
    np.testing.assert_array_equal(np.asarray(b), [2, 2, 2, 2])
    np.testing.assert_array_equal(np.asarray(c), [3, 3, 3, 3])
    assert sum(k[0] == "scaled" for k in lm._compiled) == 2

"""Gated DeltaNet decode step: one token per sequence, the state cache updated in place."""

from pallas_kernels.gdn_state_update.ops import gdn_state_update

__all__ = ["gdn_state_update"]

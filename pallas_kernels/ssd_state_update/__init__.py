"""Mamba-2 decode step: one token per sequence, the state cache updated in place."""

from pallas_kernels.ssd_state_update.ops import ssd_state_update
from pallas_kernels.ssd_state_update.reference import ssd_state_update_reference

__all__ = ["ssd_state_update", "ssd_state_update_reference"]

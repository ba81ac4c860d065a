"""Gated DeltaNet chunked prefill (FLA's algorithm) over packed sequences, scratch in the arena."""

from pallas_kernels.gdn_chunked.checks import GDN_REGION, SUPPORTED_HEAD_DIMS
from pallas_kernels.gdn_chunked.ops import gdn_chunked, gdn_chunked_into
from pallas_kernels.gdn_chunked.reference import gdn_sequential_reference

__all__ = [
    "GDN_REGION",
    "SUPPORTED_HEAD_DIMS",
    "gdn_chunked",
    "gdn_chunked_into",
    "gdn_sequential_reference",
]

"""Mamba-2 SSD chunked scan over packed sequences, with its scratch in the arena."""

from pallas_kernels.ssd_chunked_scan.ops import (
    SSD_REGION,
    SUPPORTED_CHUNK_SIZES,
    ssd_chunked_scan,
    ssd_chunked_scan_into,
)
from pallas_kernels.ssd_chunked_scan.reference import (
    ssd_chunk_quantities,
    ssd_chunked_reference,
    ssd_sequential_reference,
)

__all__ = [
    "SSD_REGION",
    "SUPPORTED_CHUNK_SIZES",
    "ssd_chunk_quantities",
    "ssd_chunked_reference",
    "ssd_chunked_scan",
    "ssd_chunked_scan_into",
    "ssd_sequential_reference",
]

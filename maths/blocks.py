"""Sizes the convex passes use and the memory estimate reads: torch-free, so the API can
estimate a model's memory without importing torch."""

BLOCK = 16_384  # rows per block of every pass on a GPU: bounds the float64 scratch of one pass
# (34 MB at 257 parameters per class; 65,536 used four times the memory and ran slower)
# On a CPU a 2,048 × 257 float64 block (4 MB) stays in cache between a pass's two products, so
# the rows come from memory once (a gradient pass about a third faster than with larger
# blocks).
CPU_BLOCK = 2_048
ROWS_BYTES = 256 * 2**20  # the largest float64 (Z, T) of the retained rows kept resident

"""The tile configurations of the GEMM (kernels/gemm.py) and their shared memory: slab depths,
row padding, the tensor-core modes (kernels/tensorcore.py) of the configurations' names."""

from numba import config

from .tensorcore import MODES

BK = 8      # slab depth
SIMT_PAD = 4    # shared row padding (words): k-fast staging stores hit 32 distinct banks
# With tensor cores (tc), lanes 4g + q read rows q (and q+4) at column g: rows 8 words apart
# (mod 32) put the 32 lanes on 32 distinct banks.
TC_PAD = 8
TC_BK = 16  # two mma k-steps per slab (TF32)
# float16: one mma k-step per slab; 32 deep (two) doubled the staging registers and spilled
# (ptxas, sm_90: 396 bytes for the 64 x 128 tile, against 192)
HMMA_BK = 16


def pad(tc):
    """Shared row padding (words) of the FP32 FMA or the tensor-core kernel."""
    return TC_PAD if tc else SIMT_PAD
# 16-byte aligned shared memory for vector loads; the simulator takes no alignment
SMEM_ALIGN = None if config.ENABLE_CUDASIM else 16


def tc_mode(tc):
    """The tensor-core mode of ``tc``: None (FP32 FMA) for False, "3xtf32" for True, else tc
    itself, one of tensorcore.MODES."""
    mode = {False: None, True: "3xtf32"}.get(tc, tc) if isinstance(tc, bool) else tc
    if mode is not None and mode not in MODES:
        raise ValueError(f"gemm_kernel: tc must be a bool or one of {MODES}, got {tc!r}")
    return mode


def shared_bytes(wm, wn, tx, ty, itemsize, bk=BK, tc=False):
    """Dynamic shared memory of one block: two stages of an A and a B slab (``bk`` deep), and
    one row of padding that the fragment prefetch reads past the last slab. The "f16"
    tensor-core mode keeps the slabs in float16 whatever ``itemsize``."""
    sa, sb = ty * wm + pad(tc), tx * wn + pad(tc)
    return (2 * bk + 1) * (sa + sb) * (2 if tc_mode(tc) == "f16" else itemsize)


# Tile configurations (wm, wn, tx, ty, min_blocks) the ops choose from (dnnkit/ops/gemm.py);
# "sim" keeps the CUDA simulator (one Python thread per CUDA thread) to 16 threads a block.
# The others multiply on tensor cores (float32 accumulation, sm_80 and later, not in the
# simulator), in the mode of their prefix (TC_PREFIXES): float32 data as 3xTF32 (tc_) or one
# TF32 product (tf32_), slabs TC_BK deep; float16 data on HMMA (hmma_), slabs HMMA_BK deep.
# Their large tiles take up to 255 registers (64 accumulators and the fragments), so 1 block
# per SM. "tiny" (32 x 128) serves products of at most 32 rows (a layer's 32 filters), which
# the 64-row tiles ran half empty.
CONFIGS = {"large": (8, 8, 16, 16, 2), "small": (4, 8, 16, 16, 2), "tiny": (2, 8, 16, 16, 2),
           "sim": (2, 2, 4, 4, 1)}
TC_PREFIXES = {"tc": ("3xtf32", "float32"), "tf32": ("tf32", "float32"),
               "hmma": ("f16", "float16")}     # prefix -> (mode, the one data type)
for _p in TC_PREFIXES:
    CONFIGS.update({f"{_p}_large": (8, 8, 16, 16, 1), f"{_p}_small": (4, 8, 16, 16, 2),
                    f"{_p}_tiny": (2, 8, 16, 16, 2)})


def config_options(name):
    """gemm_kernel's and shared_bytes's keyword arguments beyond the tile for config ``name``."""
    prefix = name.split("_")[0]
    if prefix not in TC_PREFIXES:
        return {}
    mode = TC_PREFIXES[prefix][0]
    return dict(bk=HMMA_BK if mode == "f16" else TC_BK, tc=mode)

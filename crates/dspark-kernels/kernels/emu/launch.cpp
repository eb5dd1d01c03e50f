// The emulator's entry point: launch a fused kernel by name over host memory (kernels/emu/emu.h).
// Compiled by crates/dspark-kernel-emu; the addresses inside the parameter block are host
// pointers.
#include "emu.h"

#include "../fused_verify.cu"
#if __has_include("../fused_block.cu")
#include "../fused_block.cu"
#define EMU_HAS_BLOCK 1
#endif

#define EMU_KERNEL(NAME, PARAMS)                                                                \
    if (std::strcmp(name, #NAME) == 0)                                                          \
        return emu::launch(grid, block, [](const void *a) { NAME(*(const PARAMS *)a); }, params);

extern "C" int dspark_emu_launch(const char *name, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned threads, const void *params) {
    const dim3 grid = {gx, gy, gz};
    const dim3 block = {threads, 1u, 1u};
    EMU_KERNEL(dspark_vf_stats, VfParams)
    EMU_KERNEL(dspark_vf_rows, VfParams)
    EMU_KERNEL(dspark_vf_resid, VfParams)
    EMU_KERNEL(dspark_vf_pick, VfParams)
#ifdef EMU_HAS_BLOCK
    EMU_KERNEL(dspark_sb_prep, SbParams)
    EMU_KERNEL(dspark_sb_bias, SbParams)
    EMU_KERNEL(dspark_sb_pick, SbParams)
    EMU_KERNEL(dspark_sb_topk, SbParams)
    EMU_KERNEL(dspark_sb_onehot, SbParams)
#endif
    std::fprintf(stderr, "emu: no kernel named %s\n", name);
    return 3;
}

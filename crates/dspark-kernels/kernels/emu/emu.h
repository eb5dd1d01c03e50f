// A host emulator of the CUDA subset the fused kernels use, so that their source runs on a CPU
// (crates/dspark-kernel-emu compiles kernels/*.cu as C++ with this header forced in first).
//
// A block's threads are fibers (ucontext) on one OS thread, run in turn until each finishes or
// waits: at __syncthreads() for the whole block, in a __shfl_xor_sync() for its warp. Blocks run
// one after another, so `__shared__` can be a function-local `static`. Atomics are plain
// read-modify-writes (one OS thread). Floating point is the host's IEEE arithmetic, with fmaf
// from libm and no contraction (-ffp-contract=off): the operations a GPU performs without
// fast math, so a kernel computes the same bits here as on the device.
#pragma once
#define DSPARK_EMU 1

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
};

namespace emu {

constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 256 * 1024;

enum Wait { kRun = 0, kBlock = 1, kWarp = 2, kDone = 3 };

struct State {
    dim3 grid, block, bidx;
    unsigned nthreads = 0;
    unsigned current = 0;
    ucontext_t sched;
    ucontext_t ctx[kMaxThreads];
    int wait[kMaxThreads];
    char *stacks = nullptr;
    uint64_t shfl[kMaxThreads];
    void (*body)(const void *) = nullptr;
    const void *arg = nullptr;
};

inline State &st() {
    static State s;
    return s;
}

}  // namespace emu

// CUDA's built-in variables, as reads of the emulator's state.
#define threadIdx (dim3{emu::st().current, 0u, 0u})
#define blockIdx (emu::st().bidx)
#define blockDim (emu::st().block)
#define gridDim (emu::st().grid)

inline void emu_yield(int why) {
    emu::State &s = emu::st();
    const unsigned me = s.current;
    s.wait[me] = why;
    swapcontext(&s.ctx[me], &s.sched);
}

inline void __syncthreads() { emu_yield(emu::kBlock); }
inline void __threadfence() {}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 64 bits");
    emu::State &s = emu::st();
    const unsigned me = s.current;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    s.shfl[me] = bits;
    emu_yield(emu::kWarp);
    const unsigned other = (me & ~31u) | ((me & 31u) ^ (unsigned)mask);
    T out;
    std::memcpy(&out, &s.shfl[other], sizeof(T));
    emu_yield(emu::kWarp);
    return out;
}

inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}

inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    const unsigned long long old = *p;
    *p = old + v;
    return old;
}

inline float __uint_as_float(unsigned b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

inline long long __double_as_longlong(double d) {
    long long b;
    std::memcpy(&b, &d, 8);
    return b;
}

inline unsigned __float_as_uint(float f) {
    unsigned b;
    std::memcpy(&b, &f, 4);
    return b;
}

using std::ceil;
using std::fmaf;

namespace emu {

inline void trampoline() {
    State &s = st();
    s.body(s.arg);
    s.wait[s.current] = kDone;
    swapcontext(&s.ctx[s.current], &s.sched);
}

// Release a barrier when every thread it concerns is waiting there (or has finished).
inline bool release(State &s) {
    bool any = false;
    unsigned waiting = 0, done = 0;
    for (unsigned t = 0; t < s.nthreads; t++) {
        waiting += s.wait[t] == kBlock;
        done += s.wait[t] == kDone;
    }
    if (waiting > 0 && waiting + done == s.nthreads) {
        for (unsigned t = 0; t < s.nthreads; t++)
            if (s.wait[t] == kBlock) s.wait[t] = kRun;
        any = true;
    }
    for (unsigned w = 0; w * 32 < s.nthreads; w++) {
        unsigned in = 0;
        for (unsigned l = 0; l < 32; l++) in += s.wait[w * 32 + l] == kWarp;
        if (in == 32) {
            for (unsigned l = 0; l < 32; l++) s.wait[w * 32 + l] = kRun;
            any = true;
        }
    }
    return any;
}

// Run `body(arg)` as every thread of every block of a grid.
inline int launch(dim3 grid, dim3 block, void (*body)(const void *), const void *arg) {
    State &s = st();
    const unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > (unsigned)kMaxThreads || n % 32 != 0 || block.y != 1 || block.z != 1) {
        std::fprintf(stderr, "emu: unsupported block shape\n");
        return 1;
    }
    if (!s.stacks) s.stacks = (char *)std::malloc(kStack * kMaxThreads);
    s.grid = grid;
    s.block = block;
    s.nthreads = n;
    s.body = body;
    s.arg = arg;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                s.bidx = {bx, by, bz};
                for (unsigned t = 0; t < n; t++) {
                    getcontext(&s.ctx[t]);
                    s.ctx[t].uc_stack.ss_sp = s.stacks + (size_t)t * kStack;
                    s.ctx[t].uc_stack.ss_size = kStack;
                    s.ctx[t].uc_link = nullptr;
                    makecontext(&s.ctx[t], trampoline, 0);
                    s.wait[t] = kRun;
                }
                // Alternate the order threads run in between rounds, so that a missing barrier
                // shows up as a difference whichever thread happens to run first.
                for (unsigned round = 0;; round++) {
                    bool ran = false;
                    for (unsigned q = 0; q < n; q++) {
                        const unsigned t = (round + bx + by) % 2 ? n - 1 - q : q;
                        if (s.wait[t] != kRun) continue;
                        s.current = t;
                        swapcontext(&s.sched, &s.ctx[t]);
                        ran = true;
                    }
                    unsigned done = 0;
                    for (unsigned t = 0; t < n; t++) done += s.wait[t] == kDone;
                    if (done == n) break;
                    if (!release(s) && !ran) {
                        std::fprintf(stderr, "emu: deadlock in block (%u, %u, %u)\n", bx, by, bz);
                        return 2;
                    }
                }
            }
    return 0;
}

}  // namespace emu

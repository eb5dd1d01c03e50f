// Shared pieces of the fused kernels (fused_verify.cu, fused_block.cu).
//
// - the f32 exp every dspark kernel evaluates (crate::cpu::exp_with with fused multiply-adds);
// - the counter-based uniforms of crate::sampling::rng (mix64 is pure u64 arithmetic);
// - loads of f32 / f16 / bf16 values, widened exactly;
// - block reductions in one fixed order (a xor-butterfly in each warp, then the same over the
//   warps' results), and the radix selection of a value-ordered prefix.
//
// Every floating-point operation is written out: the kernels are compiled with --fmad=false
// (no contraction) and without fast math, and crates/dspark-kernels/src/sampling/fused/ models each one
// in Rust in the same order, so the GPU agrees with its model bit for bit. The same source also
// compiles as host C++ under kernels/emu/emu.h, where the tests run it against the model.
#pragma once

#ifndef DSPARK_EMU
#include <stdint.h>
#endif

#define DS_NT 256               // threads per block, every fused kernel
#define DS_WARPS (DS_NT / 32)   // warps per block
#define DS_FULL 0xffffffffu
#define DS_NONE 0xffffffffu     // "no index"

typedef unsigned long long ds_u64;
typedef unsigned int ds_u32;

// Element dtypes of logits and weights (crate::sampling::fused::layout::Dtype).
#define DS_F32 0u
#define DS_F16 1u
#define DS_BF16 2u

__device__ __forceinline__ float ds_bits_f(ds_u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ ds_u32 ds_f_bits(float f) { return __float_as_uint(f); }

#define DS_INF ds_bits_f(0x7f800000u)
#define DS_NINF ds_bits_f(0xff800000u)

// ---- loads -------------------------------------------------------------------------------

// f16 -> f32, exact (subnormals scaled by 2^-24, which is exact in f32).
__device__ __forceinline__ float ds_f16(ds_u32 h) {
    const ds_u32 sign = (h & 0x8000u) << 16;
    const ds_u32 e = (h >> 10) & 0x1fu;
    const ds_u32 m = h & 0x3ffu;
    if (e == 0x1fu) return ds_bits_f(sign | 0x7f800000u | (m << 13));
    if (e != 0u) return ds_bits_f(sign | ((e + 112u) << 23) | (m << 13));
    const float f = (float)m * ds_bits_f(0x33800000u);  // 2^-24
    return sign ? -f : f;
}

template <ds_u32 DT>
__device__ __forceinline__ float ds_load(const void *base, ds_u64 i) {
    if (DT == DS_F32) return ((const float *)base)[i];
    const ds_u32 h = ((const unsigned short *)base)[i];
    if (DT == DS_BF16) return ds_bits_f(h << 16);
    return ds_f16(h);
}

// The same with the dtype known at run time (one uniform branch): for the launches that read
// little, where a copy per dtype would only grow the code.
__device__ __forceinline__ float ds_load_dt(const void *base, ds_u64 i, ds_u32 dt) {
    if (dt == DS_F32) return ((const float *)base)[i];
    const ds_u32 h = ((const unsigned short *)base)[i];
    if (dt == DS_BF16) return ds_bits_f(h << 16);
    return ds_f16(h);
}

// 16 bytes from `src` (16-byte aligned) into `dst`, with one vector load.
template <typename T>
__device__ __forceinline__ void ds_load16(T *dst, const T *src) {
#ifdef DSPARK_EMU
    memcpy(dst, src, 16);
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}

// ---- exp ---------------------------------------------------------------------------------

// crate::cpu::exp_with::<Fused>: the constants by their f32 bits (EXP_CONSTS).
__device__ __forceinline__ float ds_exp(float x) {
    const float lo = ds_bits_f(0xc2ae999au), hi = ds_bits_f(0x42b16666u);
    const float log2e = ds_bits_f(0x3fb8aa3bu), ln2_hi = ds_bits_f(0x3f318000u);
    const float ln2_lo = ds_bits_f(0xb95e8083u), round = ds_bits_f(0x4b400000u);
    const float p0 = ds_bits_f(0x39506967u), p1 = ds_bits_f(0x3ab743ceu);
    const float p2 = ds_bits_f(0x3c088908u), p3 = ds_bits_f(0x3d2aa9c1u);
    const float p4 = ds_bits_f(0x3e2aaaaau), p5 = ds_bits_f(0x3f000000u);
    float xc = x > lo ? x : lo;
    xc = xc < hi ? xc : hi;
    const float t = fmaf(xc, log2e, round);
    const float n = t - round;
    const float r = fmaf(n, -ln2_lo, fmaf(n, -ln2_hi, xc));
    float p = p0;
    p = fmaf(p, r, p1);
    p = fmaf(p, r, p2);
    p = fmaf(p, r, p3);
    p = fmaf(p, r, p4);
    p = fmaf(p, r, p5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    const ds_u32 n_int = ds_f_bits(t) - ds_f_bits(round);
    const float e = ds_bits_f((n_int + 127u) << 23);
    const float v = y * e;
    return x < lo ? 0.0f : v;
}

// The weight of value x in a row with max m at scale s.
__device__ __forceinline__ float ds_weight(float x, float m, float s) { return ds_exp((x - m) * s); }

// Fixed-point weights of the radix selection: w * 2^40, truncated.
#define DS_FX_ONE 1099511627776.0f
__device__ __forceinline__ ds_u64 ds_wfx(float x, float m, float s) {
    return (ds_u64)(ds_weight(x, m, s) * DS_FX_ONE);
}

// ---- counter-based uniforms (crate::sampling::rng) ---------------------------------------

#define DS_SALT_DRAFT 0x6a09e667f3bcc908ull
#define DS_SALT_ACCEPT 0xbb67ae8584caa73bull
#define DS_SALT_RESIDUAL 0x3c6ef372fe94f82bull

__device__ __forceinline__ ds_u64 ds_rotr(ds_u64 v, int n) { return (v >> n) | (v << (64 - n)); }

__device__ __forceinline__ ds_u64 ds_mix64(ds_u64 v) {
    v ^= ds_rotr(v, 49) ^ ds_rotr(v, 24);
    v *= 0x9fb21c651e98df25ull;
    v ^= v >> 28;
    v *= 0x9fb21c651e98df25ull;
    return v ^ (v >> 28);
}

__device__ __forceinline__ ds_u64 ds_combine(ds_u64 h, ds_u64 v) {
    return ds_mix64(h ^ ds_mix64(v + 0x9e3779b97f4a7c15ull));
}

// Stream::uniform(tag, slot, 0) of a request's stream.
__device__ __forceinline__ double ds_uniform(ds_u64 stream, ds_u64 salt, ds_u64 slot) {
    const ds_u64 b = ds_combine(ds_combine(ds_combine(stream, salt), slot), 0ull);
    return (double)(b >> 11) * (1.0 / 9007199254740992.0);
}

// ---- block reductions --------------------------------------------------------------------
// Each takes a shared array of DS_WARPS slots and returns the result in every thread. Sums
// are a xor-butterfly in each warp, then the same butterfly over the warps' sums (zeros in the
// missing lanes): every thread holds the same bits.

__device__ __forceinline__ float ds_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(DS_FULL, v, o);
    return v;
}

__device__ __forceinline__ double ds_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(DS_FULL, v, o);
    return v;
}

__device__ __forceinline__ float ds_block_sum(float v, float *sh) {
    v = ds_warp_sum(v);
    const ds_u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float w = lane < DS_WARPS ? sh[lane] : 0.0f;
    w = ds_warp_sum(w);
    __syncthreads();
    return w;
}

__device__ __forceinline__ float ds_block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(DS_FULL, v, o);
        v = x > v ? x : v;
    }
    const ds_u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float w = DS_NINF;
    for (int k = 0; k < DS_WARPS; k++) w = sh[k] > w ? sh[k] : w;
    __syncthreads();
    return w;
}

__device__ __forceinline__ ds_u32 ds_block_min_u32(ds_u32 v, ds_u32 *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        const ds_u32 x = __shfl_xor_sync(DS_FULL, v, o);
        v = x < v ? x : v;
    }
    const ds_u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    ds_u32 w = DS_NONE;
    for (int k = 0; k < DS_WARPS; k++) w = sh[k] < w ? sh[k] : w;
    __syncthreads();
    return w;
}

__device__ __forceinline__ ds_u32 ds_block_sum_u32(ds_u32 v, ds_u32 *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DS_FULL, v, o);
    const ds_u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    ds_u32 w = 0;
    for (int k = 0; k < DS_WARPS; k++) w += sh[k];
    __syncthreads();
    return w;
}

// ---- the inverse-CDF walk ----------------------------------------------------------------

// Over `n` parts in id order (`part(i)`, f64 weights), the last part with positive weight at or
// before the first whose running total (from `before`) exceeds `target`, and the running total
// before it (crate::sampling::fused::math::walk_parts).
template <class F>
__device__ __forceinline__ void ds_walk(ds_u32 n, F part, double before, double target,
                                        ds_u32 *at, double *at_pre) {
    double acc = before;
    *at = 0;
    *at_pre = before;
    for (ds_u32 i = 0; i < n; i++) {
        const double w = part(i);
        if (w > 0.0) {
            *at = i;
            *at_pre = acc;
            if (acc + w > target) break;
        }
        acc = acc + w;
    }
}

// ---- value order -------------------------------------------------------------------------
// Keys that order f32 values as f32::total_cmp does (larger value, larger key).

__device__ __forceinline__ ds_u32 ds_key(float x) {
    const ds_u32 b = ds_f_bits(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float ds_from_key(ds_u32 k) {
    return ds_bits_f((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A value-descending, id-ascending prefix, by its last member (crate::sampling::filter::Cut,
// compared by key).
struct DsCut {
    ds_u32 key;
    ds_u32 id;
};

__device__ __forceinline__ bool ds_finite_logit(float x) { return x > DS_NINF && x < DS_INF; }

__device__ __forceinline__ bool ds_keeps(DsCut c, float x, ds_u32 v) {
    const ds_u32 k = ds_key(x);
    return k > c.key || (k == c.key && v <= c.id);
}

// ---- radix selection of a value-ordered prefix -------------------------------------------
// Over the eligible values of a row (finite, and kept by `prior` when there is one), in value
// order (descending, ties by id): the shortest prefix that reaches a goal, by its last member.
// Goals: COUNT (k values), FRACTION (>= top_p of the prefix's fixed-point mass, the mass being
// ds_wfx at (m, s)), DRAW (the first member whose cumulative mass exceeds floor(u * total)).
// Four passes of 8-bit digits from the top (histograms of counts and fixed-point masses, in
// per-warp copies merged in order: integers, so the result does not depend on scheduling),
// then one pass that finds the tie (the j-th value equal to the last key, in id order).

#define DS_GOAL_COUNT 0u
#define DS_GOAL_FRACTION 1u
#define DS_GOAL_DRAW 2u

struct DsRadixShared {
    ds_u32 cnt[DS_WARPS][256];
    ds_u64 mass[DS_WARPS][256];
    ds_u32 seg[DS_NT];
    ds_u32 prefix, digit, exhausted, found, j, id, seg_t, need;
    ds_u64 above_mass, total_mass, goal;
    ds_u32 above_cnt, total_cnt;
};

struct DsRadix {
    ds_u32 found;  // 0: no eligible value
    DsCut cut;     // the last member
    ds_u64 mass;   // fixed-point mass of the prefix (DS_GOAL_COUNT: not computed)
    ds_u64 total;  // fixed-point mass of every eligible value (DS_GOAL_COUNT: not computed)
};

__device__ __forceinline__ bool ds_eligible(const void *row, ds_u64 off, ds_u32 dt, ds_u32 v,
                                            bool has_prior, DsCut prior, float *out) {
    const float x = ds_load_dt(row, off + v, dt);
    *out = x;
    if (!ds_finite_logit(x)) return false;
    return !has_prior || ds_keeps(prior, x, v);
}

__device__ __forceinline__ DsRadix ds_radix(const void *row, ds_u64 off, ds_u32 dt, ds_u32 len,
                                            bool has_prior, DsCut prior,
                            ds_u32 goal_kind, ds_u64 k, float top_p, double u, float m, float s,
                            DsRadixShared *sh) {
    const ds_u32 t = threadIdx.x, lane = t & 31u, warp = t >> 5;
    const bool with_mass = goal_kind != DS_GOAL_COUNT;
    if (t == 0) {
        sh->prefix = 0;
        sh->exhausted = 0;
        sh->above_mass = 0;
        sh->above_cnt = 0;
    }
    for (ds_u32 pass = 0; pass < 4; pass++) {
        const ds_u32 shift = 24u - 8u * pass;
        for (ds_u32 b = lane; b < 256u; b += 32u) {
            sh->cnt[warp][b] = 0;
            sh->mass[warp][b] = 0;
        }
        __syncthreads();
        const ds_u32 prefix = sh->prefix;
        for (ds_u32 v = t; v < len; v += DS_NT) {
            float x;
            if (!ds_eligible(row, off, dt, v, has_prior, prior, &x)) continue;
            const ds_u32 key = ds_key(x);
            if (pass > 0 && (key >> (shift + 8u)) != prefix) continue;
            const ds_u32 d = (key >> shift) & 255u;
            atomicAdd(&sh->cnt[warp][d], 1u);
            if (with_mass) atomicAdd(&sh->mass[warp][d], ds_wfx(x, m, s));
        }
        __syncthreads();
        {
            ds_u32 c = 0;
            ds_u64 w = 0;
            for (int q = 0; q < DS_WARPS; q++) {
                c += sh->cnt[q][t];
                w += sh->mass[q][t];
            }
            __syncthreads();
            sh->cnt[0][t] = c;
            sh->mass[0][t] = w;
        }
        __syncthreads();
        if (t == 0) {
            if (pass == 0) {
                ds_u32 tc = 0;
                ds_u64 tm = 0;
                for (int d = 0; d < 256; d++) {
                    tc += sh->cnt[0][d];
                    tm += sh->mass[0][d];
                }
                sh->total_cnt = tc;
                sh->total_mass = tm;
                sh->found = tc > 0;
                if (goal_kind == DS_GOAL_COUNT) sh->goal = k;
                else if (goal_kind == DS_GOAL_FRACTION) sh->goal = (ds_u64)ceil((double)top_p * (double)tm);
                else sh->goal = (ds_u64)(u * (double)tm);
            }
            const ds_u64 goal = sh->goal;
            int chosen = -1, lowest = -1;
            ds_u32 acnt = sh->above_cnt;
            ds_u64 amass = sh->above_mass;
            for (int d = 255; d >= 0; d--) {
                const ds_u32 c = sh->cnt[0][d];
                if (c == 0) continue;
                if (!sh->exhausted) {
                    const ds_u64 reach =
                        goal_kind == DS_GOAL_COUNT ? (ds_u64)acnt + c : amass + sh->mass[0][d];
                    const bool hit = goal_kind == DS_GOAL_DRAW ? reach > goal : reach >= goal;
                    if (hit) {
                        chosen = d;
                        break;
                    }
                }
                acnt += c;
                amass += sh->mass[0][d];
                lowest = d;
            }
            if (chosen < 0) {
                // Nothing reached the goal (or an earlier pass ran out): the last value in
                // order, with everything above it.
                chosen = lowest < 0 ? 0 : lowest;
                if (lowest >= 0) {
                    acnt -= sh->cnt[0][lowest];
                    amass -= sh->mass[0][lowest];
                }
                sh->exhausted = 1;
            }
            sh->above_cnt = acnt;
            sh->above_mass = amass;
            sh->digit = (ds_u32)chosen;
            sh->prefix = (sh->prefix << 8) | (ds_u32)chosen;
        }
        __syncthreads();
        if (!sh->found) {
            DsRadix none;
            none.found = 0;
            none.cut.key = 0;
            none.cut.id = 0;
            none.mass = 0;
            none.total = 0;
            return none;
        }
    }
    // The tie: how many values equal to the last key the prefix takes, then which one.
    if (t == 0) {
        const ds_u32 n_eq = sh->cnt[0][sh->digit];
        ds_u64 j;
        if (sh->exhausted) {
            j = n_eq;
        } else if (goal_kind == DS_GOAL_COUNT) {
            j = sh->goal - sh->above_cnt;
        } else {
            const ds_u64 w = ds_wfx(ds_from_key(sh->prefix), m, s);
            const ds_u64 rem = sh->goal - sh->above_mass;
            if (w == 0) j = n_eq;
            else if (goal_kind == DS_GOAL_DRAW) j = rem / w + 1;
            else j = (rem + w - 1) / w;
        }
        if (j < 1) j = 1;
        if (j > n_eq) j = n_eq;
        sh->j = (ds_u32)j;
    }
    __syncthreads();
    const ds_u32 key = sh->prefix;
    const ds_u32 per = (len + DS_NT - 1u) / DS_NT;
    const ds_u32 lo = t * per < len ? t * per : len;
    const ds_u32 hi = lo + per < len ? lo + per : len;
    ds_u32 c = 0;
    for (ds_u32 v = lo; v < hi; v++) {
        float x;
        if (ds_eligible(row, off, dt, v, has_prior, prior, &x) && ds_key(x) == key) c++;
    }
    sh->seg[t] = c;
    __syncthreads();
    if (t == 0) {
        ds_u32 pre = 0, at = 0, need = 1;
        for (ds_u32 q = 0; q < DS_NT; q++) {
            if (pre + sh->seg[q] >= sh->j) {
                at = q;
                need = sh->j - pre;
                break;
            }
            pre += sh->seg[q];
        }
        sh->seg_t = at;
        sh->need = need;
    }
    __syncthreads();
    if (t == sh->seg_t) {
        ds_u32 seen = 0;
        for (ds_u32 v = lo; v < hi; v++) {
            float x;
            if (ds_eligible(row, off, dt, v, has_prior, prior, &x) && ds_key(x) == key) {
                seen++;
                if (seen == sh->need) {
                    sh->id = v;
                    break;
                }
            }
        }
    }
    __syncthreads();
    DsRadix out;
    out.found = 1;
    out.cut.key = key;
    out.cut.id = sh->id;
    out.total = sh->total_mass;
    if (with_mass) {
        const ds_u64 w = ds_wfx(ds_from_key(key), m, s);
        out.mass = sh->above_mass + (ds_u64)sh->j * w;
    } else {
        out.mass = 0;
    }
    __syncthreads();
    return out;
}

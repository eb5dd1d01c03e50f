// The fused verification's parameter block, records and status words (declared field for field
// in crates/dspark-kernels/src/sampling/fused/layout.rs), and the walk over a request's row
// verdicts that every later launch of fused_verify.cu starts from.
#pragma once
#include "fused_common.cuh"

#define VF_MAXB 128
#define VF_MAX_STOPS 64
#define VF_CH 8192
#define VF_EPT (VF_CH / DS_NT)

// Row flags.
#define VF_T_NONFINITE 1u
#define VF_T_NOFINITE 2u
#define VF_D_NONFINITE 4u
#define VF_D_NOFINITE 8u
#define VF_ACCEPT 16u
#define VF_CUT 32u
#define VF_TOPK 64u

// Status kinds.
#define VF_ERR_T_NONFINITE 1u
#define VF_ERR_T_NOFINITE 2u
#define VF_ERR_D_NONFINITE 3u
#define VF_ERR_D_NOFINITE 4u
#define VF_ERR_TOKEN 5u

// Draws.
#define VF_DRAW_NONE 0u
#define VF_DRAW_RESIDUAL 1u
#define VF_DRAW_P 2u

struct VfReq {
    ds_u64 stream;  // the request's random stream
    float s;        // 1 / temperature (sampled requests)
    float top_p;    // in (0, 1]
    ds_u32 top_k;   // values kept by top-k (off when >= V)
    ds_u32 n;       // drafts to verify; bit 31: greedy
};

struct VfParams {
    ds_u64 target, draft, tokens, stops, chunks, rows, resid, out;
    ds_u32 batch, width, vocab, nchunks;
    ds_u32 dt_target, dt_draft, tok_kind, has_draft;
    ds_u32 nstops, pad0, pad1, pad2;
    ds_u32 stop[VF_MAX_STOPS];
    VfReq req[VF_MAXB];
};

struct VfChunk {
    float max;
    ds_u32 argmax;
    ds_u32 nans;
    float sum;
};

struct VfRow {
    double zp;    // normalizer of p (kept mass)
    double zq;    // normalizer of q
    ds_u64 zfx;   // kept mass in fixed point (rows with a cut)
    float m;      // row max
    float mq;     // draft row max
    ds_u32 cut_key, cut_id, argmax, flags;
};

struct VfResid {
    float rsum;
    float msum;
};

struct VfOutcome {
    ds_u32 kind, pos;
    long long detail;
    ds_u32 accepted, draw, j;
    int last;
};

static_assert(sizeof(VfReq) == 24, "VfReq layout");
static_assert(sizeof(VfParams) == 112 + 4 * VF_MAX_STOPS + 24 * VF_MAXB, "VfParams layout");
static_assert(sizeof(VfChunk) == 16, "VfChunk layout");
static_assert(sizeof(VfRow) == 48, "VfRow layout");

__device__ __forceinline__ ds_u32 vf_n(const VfReq &q) { return q.n & 0x7fffffffu; }
__device__ __forceinline__ bool vf_greedy(const VfReq &q) { return (q.n >> 31) != 0u; }

__device__ __forceinline__ long long vf_token(const VfParams &p, ds_u32 r, ds_u32 i) {
    const ds_u64 at = (ds_u64)r * (p.width - 1u) + i;
    if (p.tok_kind == 0u) return ((const long long *)p.tokens)[at];
    if (p.tok_kind == 1u) return ((const int *)p.tokens)[at];
    return (long long)((const ds_u32 *)p.tokens)[at];
}

__device__ __forceinline__ bool vf_is_stop(const VfParams &p, long long x) {
    const ds_u32 *s = p.stops ? (const ds_u32 *)p.stops : p.stop;
    ds_u32 lo = 0, hi = p.nstops;
    while (lo < hi) {
        const ds_u32 mid = (lo + hi) >> 1;
        const long long v = s[mid];
        if (v == x) return true;
        if (v < x) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

__device__ __forceinline__ const VfRow *vf_rows(const VfParams &p, ds_u32 r) {
    return (const VfRow *)p.rows + (ds_u64)r * p.width;
}

// The fast path's walk of one request (crate::sampling::verify::cpu::verify_one), over the rows'
// verdicts: where the round ends, what it draws, and the first error in the fast path's order.
__device__ __forceinline__ VfOutcome vf_walk(const VfParams &p, ds_u32 r) {
    VfOutcome o;
    o.kind = 0;
    o.pos = 0;
    o.detail = 0;
    o.accepted = 0;
    o.draw = VF_DRAW_NONE;
    o.j = 0;
    o.last = -1;
    const VfReq q = p.req[r];
    const ds_u32 n = vf_n(q);
    const bool greedy = vf_greedy(q);
    for (ds_u32 i = 0; i < n; i++) {
        const long long x = vf_token(p, r, i);
        if (x < 0 || x >= (long long)p.vocab) {
            o.kind = VF_ERR_TOKEN;
            o.pos = i;
            o.detail = x;
            return o;
        }
    }
    const VfRow *rows = vf_rows(p, r);
    ds_u32 checked = 0, dchecked = 0;
    bool ended = false;
    for (ds_u32 i = 0; i < n; i++) {
        checked = i + 1;
        const ds_u32 f = rows[i].flags;
        if (f & VF_T_NONFINITE) { o.kind = VF_ERR_T_NONFINITE; o.pos = i; return o; }
        if (f & VF_T_NOFINITE) { o.kind = VF_ERR_T_NOFINITE; o.pos = i; return o; }
        if (greedy) {
            if (!(f & VF_ACCEPT)) {
                o.j = i;
                o.last = (int)rows[i].argmax;
                ended = true;
                break;
            }
        } else {
            if (p.has_draft) {
                dchecked = i + 1;
                if (f & VF_D_NONFINITE) { o.kind = VF_ERR_D_NONFINITE; o.pos = i; return o; }
                if (f & VF_D_NOFINITE) { o.kind = VF_ERR_D_NOFINITE; o.pos = i; return o; }
            }
            if (!(f & VF_ACCEPT)) {
                o.j = i;
                o.draw = VF_DRAW_RESIDUAL;
                ended = true;
                break;
            }
        }
        o.accepted++;
        if (vf_is_stop(p, vf_token(p, r, i))) {
            ended = true;
            break;
        }
    }
    if (!ended) {
        checked = n + 1;
        const ds_u32 f = rows[n].flags;
        if (f & VF_T_NONFINITE) { o.kind = VF_ERR_T_NONFINITE; o.pos = n; return o; }
        if (f & VF_T_NOFINITE) { o.kind = VF_ERR_T_NOFINITE; o.pos = n; return o; }
        o.j = n;
        if (greedy) o.last = (int)rows[n].argmax;
        else o.draw = VF_DRAW_P;
    }
    for (ds_u32 i = checked; i <= n; i++) {
        const ds_u32 f = rows[i].flags;
        if (f & VF_T_NONFINITE) { o.kind = VF_ERR_T_NONFINITE; o.pos = i; return o; }
        if (f & VF_T_NOFINITE) { o.kind = VF_ERR_T_NOFINITE; o.pos = i; return o; }
    }
    if (p.has_draft) {
        for (ds_u32 i = dchecked; i < n; i++) {
            if (rows[i].flags & VF_D_NONFINITE) { o.kind = VF_ERR_D_NONFINITE; o.pos = i; return o; }
        }
    }
    return o;
}

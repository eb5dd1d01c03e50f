// The fused verification: lossless rejection sampling of a drafted block in four launches.
//
//   dspark_vf_stats  grid (chunks, rows): each block reads one 8192-wide chunk of one target
//                    or draft row once: max, first argmax, NaN count, sum of exp((x-max)*s).
//   dspark_vf_rows   grid (B*(K+1)): per target row, merges its chunks (and its draft row's):
//                    validity, the normalizer, top-k / top-p cuts (radix selection), and the
//                    accept test u*q(x) < p(x) of the row's draft token.
//   dspark_vf_resid  grid (chunks, B): per request, walks its rows to the draw (first reject,
//                    or the bonus row) and sums that row's chunk: residual mass
//                    max(p - q, 0) and kept p mass.
//   dspark_vf_pick   grid (B): walks again, draws the correction or bonus token (inverse CDF
//                    in id order: chunks, then 32-value segments, then values; top-k rows in
//                    value order by radix selection) and writes the request's words.
//
// Per-request settings come by value in the parameter block; draft tokens are read where they
// are, and checked here. Output: per request K+1 tokens (-1 padded), the accepted count, a
// status word (kind << 32 | position), its detail, and a witness: a hash of every record the
// request's launches produced (row verdicts, residual sums), so that a comparison of words is
// a comparison of the intermediate floats too. crates/dspark-kernels/src/sampling/fused/verify.rs
// is this file's Rust model (the same operations in the same order).
#include "fused_verify.cuh"

// ---- dspark_vf_stats -----------------------------------------------------------------------

template <ds_u32 DT>
__device__ void vf_chunk(const void *base, ds_u64 off, ds_u32 len, ds_u32 start, bool want_sum,
                         float s, VfChunk *dst) {
    __shared__ float shf[DS_WARPS];
    __shared__ ds_u32 shu[DS_WARPS];
    float x[VF_EPT];
    float lmax = DS_NINF;
    ds_u32 larg = DS_NONE, nans = 0;
#pragma unroll
    for (int e = 0; e < VF_EPT; e++) {
        const ds_u32 j = threadIdx.x + (ds_u32)e * DS_NT;
        const float v = j < len ? ds_load<DT>(base, off + j) : DS_NINF;
        x[e] = v;
        if (v != v) {
            nans++;
        } else if (v > lmax) {
            lmax = v;
            larg = start + j;
        }
    }
    const float m = ds_block_max(lmax, shf);
    ds_u32 am = ds_block_min_u32(lmax == m && m > DS_NINF ? larg : DS_NONE, shu);
    if (am == DS_NONE) am = start;
    const ds_u32 nn = ds_block_sum_u32(nans, shu);
    float sum = 0.0f;
    if (want_sum && m > DS_NINF && m < DS_INF) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < VF_EPT; e++) {
            const ds_u32 j = threadIdx.x + (ds_u32)e * DS_NT;
            if (j < len) acc = acc + ds_weight(x[e], m, s);
        }
        sum = ds_block_sum(acc, shf);
    }
    if (threadIdx.x == 0) {
        VfChunk c;
        c.max = m;
        c.argmax = am;
        c.nans = nn;
        c.sum = sum;
        *dst = c;
    }
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_vf_stats(const VfParams p) {
    const ds_u32 c = blockIdx.x, row = blockIdx.y;
    const ds_u32 W = p.width, K = W - 1u, V = p.vocab;
    const bool draft = row >= p.batch * W;
    const ds_u32 local = draft ? row - p.batch * W : row;
    const ds_u32 r = draft ? local / K : local / W;
    const ds_u32 i = draft ? local % K : local % W;
    const VfReq q = p.req[r];
    const ds_u32 n = vf_n(q);
    if (draft ? i >= n : i > n) return;
    const bool want_sum = !vf_greedy(q);
    const float s = draft ? 1.0f : q.s;
    const ds_u32 start = c * VF_CH;
    const ds_u32 len = V - start < VF_CH ? V - start : VF_CH;
    const ds_u64 off = (ds_u64)local * V + start;
    VfChunk *dst = (VfChunk *)p.chunks + (ds_u64)row * p.nchunks + c;
    const void *base = (const void *)(draft ? p.draft : p.target);
    const ds_u32 dt = draft ? p.dt_draft : p.dt_target;
    if (dt == DS_F32) vf_chunk<DS_F32>(base, off, len, start, want_sum, s, dst);
    else if (dt == DS_BF16) vf_chunk<DS_BF16>(base, off, len, start, want_sum, s, dst);
    else vf_chunk<DS_F16>(base, off, len, start, want_sum, s, dst);
}

// ---- dspark_vf_rows ------------------------------------------------------------------------

// Merge a row's chunks in order: max, first argmax, NaNs, and (with `sum`) the normalizer.
__device__ void vf_merge(const VfChunk *ch, ds_u32 nch, bool sum, float s, float *m, ds_u32 *am,
                         ds_u32 *nans, double *z) {
    float best = DS_NINF;
    ds_u32 arg = 0, nn = 0;
    for (ds_u32 c = 0; c < nch; c++) {
        nn += ch[c].nans;
        if (ch[c].max > best) {
            best = ch[c].max;
            arg = ch[c].argmax;
        }
    }
    double total = 0.0;
    if (sum && best > DS_NINF && best < DS_INF) {
        for (ds_u32 c = 0; c < nch; c++) {
            if (ch[c].sum > 0.0f) total = total + (double)ch[c].sum * (double)ds_weight(ch[c].max, best, s);
        }
    }
    *m = best;
    *am = arg;
    *nans = nn;
    *z = total;
}

__device__ __forceinline__ ds_u32 vf_validity(float m, ds_u32 nans, ds_u32 nonfinite, ds_u32 nofinite) {
    if (nans > 0u || m == DS_INF) return nonfinite;
    if (!(m > DS_NINF)) return nofinite;
    return 0u;
}

// Sum of the fixed-point weights of the values a cut keeps (integers: any order).
__device__ ds_u64 vf_kept_mass(const void *row, ds_u64 off, ds_u32 dt, ds_u32 len, DsCut cut,
                               float m, float s, ds_u64 *sh) {
    ds_u64 acc = 0;
    for (ds_u32 v = threadIdx.x; v < len; v += DS_NT) {
        const float x = ds_load_dt(row, off + v, dt);
        if (ds_finite_logit(x) && ds_keeps(cut, x, v)) acc += ds_wfx(x, m, s);
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    ds_u64 total = 0;
    for (int t = 0; t < DS_NT; t++) total += sh[t];
    __syncthreads();
    return total;
}

// The top-k / top-p cut of a sampled target row, and its kept mass.
__device__ void vf_truncate(const VfParams &p, ds_u32 r, ds_u32 i, const VfReq &q, VfRow *rec,
                            DsRadixShared *rsh) {
    const void *row = (const void *)p.target;
    const ds_u64 off = ((ds_u64)r * p.width + i) * p.vocab;
    DsCut cut;
    cut.key = 0;
    cut.id = 0;
    bool has = false;
    ds_u32 flags = VF_CUT;
    if (q.top_k < p.vocab) {
        const DsRadix a = ds_radix(row, off, p.dt_target, p.vocab, false, cut, DS_GOAL_COUNT,
                                   q.top_k, 1.0f, 0.0, rec->m, q.s, rsh);
        cut = a.cut;
        has = true;
        flags |= VF_TOPK;
    }
    ds_u64 zfx;
    if (q.top_p < 1.0f) {
        const DsRadix b = ds_radix(row, off, p.dt_target, p.vocab, has, cut, DS_GOAL_FRACTION, 0,
                                   q.top_p, 0.0, rec->m, q.s, rsh);
        cut = b.cut;
        zfx = b.mass;
    } else {
        zfx = vf_kept_mass(row, off, p.dt_target, p.vocab, cut, rec->m, q.s, (ds_u64 *)rsh->mass);
    }
    if (threadIdx.x == 0) {
        rec->flags |= flags;
        rec->cut_key = cut.key;
        rec->cut_id = cut.id;
        rec->zfx = zfx;
        rec->zp = (double)zfx * (1.0 / 1099511627776.0);
    }
}

__device__ void vf_accept(const VfParams &p, ds_u32 r, ds_u32 i, const VfReq &q, VfRow *rec) {
    const long long x = vf_token(p, r, i);
    if (x < 0 || x >= (long long)p.vocab) return;  // reported by the walk
    const ds_u32 V = p.vocab, W = p.width;
    const float xv = ds_load_dt((const void *)p.target, ((ds_u64)r * W + i) * V + (ds_u64)x, p.dt_target);
    const bool kept = xv > DS_NINF && (!(rec->flags & VF_CUT) || ds_keeps({rec->cut_key, rec->cut_id}, xv, (ds_u32)x));
    const double px = kept ? (double)ds_weight(xv, rec->m, q.s) / rec->zp : 0.0;
    double qx = 1.0;
    if (p.has_draft) {
        const float yv =
            ds_load_dt((const void *)p.draft, ((ds_u64)r * (W - 1u) + i) * V + (ds_u64)x, p.dt_draft);
        qx = yv > DS_NINF ? (double)ds_weight(yv, rec->mq, 1.0f) / rec->zq : 0.0;
    }
    const double u = ds_uniform(q.stream, DS_SALT_ACCEPT, i);
    if (u * qx < px) rec->flags |= VF_ACCEPT;
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_vf_rows(const VfParams p) {
    __shared__ VfRow rec_sh;
    __shared__ DsRadixShared rsh;
    const ds_u32 W = p.width, K = W - 1u, V = p.vocab, nch = p.nchunks;
    const ds_u32 r = blockIdx.x / W, i = blockIdx.x % W;
    const VfReq q = p.req[r];
    const ds_u32 n = vf_n(q);
    const bool greedy = vf_greedy(q);
    if (i > n) return;
    if (threadIdx.x == 0) {
        VfRow rec;
        rec.zp = 0.0;
        rec.zq = 0.0;
        rec.zfx = 0;
        rec.mq = 0.0f;
        rec.cut_key = 0;
        rec.cut_id = 0;
        const VfChunk *ch = (const VfChunk *)p.chunks + ((ds_u64)r * W + i) * nch;
        ds_u32 nans;
        vf_merge(ch, nch, !greedy, q.s, &rec.m, &rec.argmax, &nans, &rec.zp);
        rec.flags = vf_validity(rec.m, nans, VF_T_NONFINITE, VF_T_NOFINITE);
        if (p.has_draft && i < n) {
            const VfChunk *dc = (const VfChunk *)p.chunks + ((ds_u64)p.batch * W + (ds_u64)r * K + i) * nch;
            ds_u32 dnans, darg;
            vf_merge(dc, nch, !greedy, 1.0f, &rec.mq, &darg, &dnans, &rec.zq);
            rec.flags |= vf_validity(rec.mq, dnans, VF_D_NONFINITE, VF_D_NOFINITE);
        }
        rec_sh = rec;
    }
    __syncthreads();
    const bool tvalid = !(rec_sh.flags & (VF_T_NONFINITE | VF_T_NOFINITE));
    if (!greedy && tvalid && (q.top_k < V || q.top_p < 1.0f)) vf_truncate(p, r, i, q, &rec_sh, &rsh);
    __syncthreads();
    if (threadIdx.x == 0) {
        VfRow rec = rec_sh;
        if (i < n) {
            const bool dvalid = !(rec.flags & (VF_D_NONFINITE | VF_D_NOFINITE));
            if (greedy) {
                const long long x = vf_token(p, r, i);
                if (x == (long long)rec.argmax) rec.flags |= VF_ACCEPT;
            } else if (tvalid && dvalid) {
                vf_accept(p, r, i, q, &rec);
            }
        }
        ((VfRow *)p.rows)[(ds_u64)r * W + i] = rec;
    }
}

// ---- dspark_vf_resid -----------------------------------------------------------------------

// The draw weights of value v of the draw row: p's kept weight relative to the row max, and
// the residual max(p - q, 0) (q: the draft row, or one-hot at the rejected token).
struct VfDrawRow {
    ds_u64 t_off, d_off;
    ds_u32 dt_t, dt_d;
    float m, s, mq, inv_zp, inv_zq;
    DsCut cut;
    bool cut_on, draft_on;
    ds_u32 onehot;
};

__device__ __forceinline__ float vf_pw(const VfParams &p, const VfDrawRow &d, ds_u32 v) {
    const float x = ds_load_dt((const void *)p.target, d.t_off + v, d.dt_t);
    const bool kept = x > DS_NINF && (!d.cut_on || ds_keeps(d.cut, x, v));
    return kept ? ds_weight(x, d.m, d.s) : 0.0f;
}

__device__ __forceinline__ float vf_rw(const VfParams &p, const VfDrawRow &d, ds_u32 v, float w) {
    const float pv = w * d.inv_zp;
    float qv;
    if (d.draft_on) {
        qv = ds_weight(ds_load_dt((const void *)p.draft, d.d_off + v, d.dt_d), d.mq, 1.0f) * d.inv_zq;
    } else {
        qv = v == d.onehot ? 1.0f : 0.0f;
    }
    const float rr = pv - qv;
    return rr > 0.0f ? rr : 0.0f;
}

__device__ __forceinline__ VfDrawRow vf_draw_row(const VfParams &p, ds_u32 r, const VfOutcome &o) {
    const VfRow rec = vf_rows(p, r)[o.j];
    const VfReq q = p.req[r];
    VfDrawRow d;
    d.t_off = ((ds_u64)r * p.width + o.j) * p.vocab;
    d.d_off = ((ds_u64)r * (p.width - 1u) + o.j) * p.vocab;
    d.dt_t = p.dt_target;
    d.dt_d = p.dt_draft;
    d.m = rec.m;
    d.s = q.s;
    d.mq = rec.mq;
    d.inv_zp = (float)(1.0 / rec.zp);
    d.inv_zq = p.has_draft ? (float)(1.0 / rec.zq) : 0.0f;
    d.cut.key = rec.cut_key;
    d.cut.id = rec.cut_id;
    d.cut_on = (rec.flags & VF_CUT) != 0u;
    d.draft_on = p.has_draft != 0u && o.draw == VF_DRAW_RESIDUAL;
    d.onehot = o.draw == VF_DRAW_RESIDUAL && !p.has_draft ? (ds_u32)vf_token(p, r, o.j) : DS_NONE;
    return d;
}

__device__ void vf_resid_chunk(const VfParams &p, const VfDrawRow &d, ds_u32 c, bool residual,
                               VfResid *dst) {
    __shared__ float shf[DS_WARPS];
    const ds_u32 start = c * VF_CH;
    float rs = 0.0f, ms = 0.0f;
    for (int e = 0; e < VF_EPT; e++) {
        const ds_u32 v = start + threadIdx.x + (ds_u32)e * DS_NT;
        if (v >= p.vocab) break;
        const float w = vf_pw(p, d, v);
        ms = ms + w;
        if (residual) rs = rs + vf_rw(p, d, v, w);
    }
    const float rsum = ds_block_sum(rs, shf);
    const float msum = ds_block_sum(ms, shf);
    if (threadIdx.x == 0) {
        VfResid out;
        out.rsum = rsum;
        out.msum = msum;
        *dst = out;
    }
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_vf_resid(const VfParams p) {
    __shared__ VfOutcome o_sh;
    const ds_u32 c = blockIdx.x, r = blockIdx.y;
    if (threadIdx.x == 0) o_sh = vf_walk(p, r);
    __syncthreads();
    const VfOutcome o = o_sh;
    if (o.kind != 0u || o.draw == VF_DRAW_NONE) return;
    const VfRow rec = vf_rows(p, r)[o.j];
    if (o.draw == VF_DRAW_P && (rec.flags & VF_TOPK)) return;
    const VfDrawRow d = vf_draw_row(p, r, o);
    const bool residual = o.draw == VF_DRAW_RESIDUAL;
    VfResid *dst = (VfResid *)p.resid + (ds_u64)r * p.nchunks + c;
    vf_resid_chunk(p, d, c, residual, dst);
}

// ---- dspark_vf_pick ------------------------------------------------------------------------

struct VfPickShared {
    double segs[DS_NT];
    double before, target, total, seg_pre;
    ds_u32 chunk, seg;
    int token;
    ds_u32 ok;
};

// Inverse CDF in id order with weight total `total` and uniform u: the chunk (from the chunk
// sums of dspark_vf_resid), then a 32-value segment of it, then the value.
__device__ __forceinline__ int vf_draw_id(const VfParams &p, ds_u32 r, const VfDrawRow &d, bool residual,
                          double total, double u, VfPickShared *sh) {
    const ds_u32 t = threadIdx.x;
    if (t == 0) {
        const VfResid *rs = (const VfResid *)p.resid + (ds_u64)r * p.nchunks;
        const double target = u * total;
        ds_walk(
            p.nchunks, [&](ds_u32 c) { return (double)(residual ? rs[c].rsum : rs[c].msum); },
            0.0, target, &sh->chunk, &sh->before);
        sh->target = target;
    }
    __syncthreads();
    const ds_u32 lo = sh->chunk * VF_CH + t * VF_EPT;
    double seg = 0.0;
    for (ds_u32 e = 0; e < VF_EPT; e++) {
        const ds_u32 v = lo + e;
        if (v >= p.vocab) break;
        const float w = vf_pw(p, d, v);
        seg = seg + (double)(residual ? vf_rw(p, d, v, w) : w);
    }
    sh->segs[t] = seg;
    __syncthreads();
    if (t == 0) {
        ds_walk(DS_NT, [&](ds_u32 q) { return sh->segs[q]; }, sh->before, sh->target, &sh->seg,
                &sh->seg_pre);
    }
    __syncthreads();
    if (t == sh->seg) {
        double acc = sh->seg_pre;
        int last = -1;
        for (ds_u32 e = 0; e < VF_EPT; e++) {
            const ds_u32 v = lo + e;
            if (v >= p.vocab) break;
            const float w = vf_pw(p, d, v);
            const double x = (double)(residual ? vf_rw(p, d, v, w) : w);
            if (x > 0.0) {
                acc = acc + x;
                last = (int)v;
                if (acc > sh->target) break;
            }
        }
        sh->token = last;
    }
    __syncthreads();
    return sh->token;
}

__device__ __forceinline__ int vf_draw(const VfParams &p, ds_u32 r, const VfOutcome &o, VfPickShared *sh,
                       DsRadixShared *rsh) {
    const ds_u32 t = threadIdx.x;
    const VfRow rec = vf_rows(p, r)[o.j];
    const VfReq q = p.req[r];
    const double u = ds_uniform(q.stream, DS_SALT_RESIDUAL, o.j);
    VfDrawRow d = vf_draw_row(p, r, o);
    const VfResid *rs = (const VfResid *)p.resid + (ds_u64)r * p.nchunks;
    bool from_p = o.draw == VF_DRAW_P;
    if (!from_p) {
        if (t == 0) {
            double total = 0.0;
            for (ds_u32 c = 0; c < p.nchunks; c++) total = total + (double)rs[c].rsum;
            sh->total = total;
            sh->ok = total > 1e-9;
        }
        __syncthreads();
        if (sh->ok) return vf_draw_id(p, r, d, true, sh->total, u, sh);
        from_p = true;
    }
    if (rec.flags & VF_TOPK) {
        const DsRadix k = ds_radix((const void *)p.target, d.t_off, p.dt_target, p.vocab, true,
                                   d.cut, DS_GOAL_DRAW, 0, 1.0f, u, rec.m, q.s, rsh);
        return (int)k.cut.id;
    }
    if (t == 0) {
        double total = 0.0;
        for (ds_u32 c = 0; c < p.nchunks; c++) total = total + (double)rs[c].msum;
        sh->total = total;
        sh->ok = total > 0.0;
    }
    __syncthreads();
    if (!sh->ok) return (int)rec.argmax;
    return vf_draw_id(p, r, d, false, sh->total, u, sh);
}

// The witness word: a hash of the request's row verdicts and, when dspark_vf_resid ran for it,
// its chunk sums.
__device__ __forceinline__ ds_u64 vf_witness(const VfParams &p, ds_u32 r, const VfOutcome &o) {
    const VfRow *rows = vf_rows(p, r);
    const ds_u32 n = vf_n(p.req[r]);
    ds_u64 h = 0x243f6a8885a308d3ull;
    for (ds_u32 i = 0; i <= n; i++) {
        const VfRow rec = rows[i];
        h = ds_combine(h, (ds_u64)__double_as_longlong(rec.zp));
        h = ds_combine(h, (ds_u64)__double_as_longlong(rec.zq));
        h = ds_combine(h, rec.zfx);
        h = ds_combine(h, ((ds_u64)ds_f_bits(rec.m) << 32) | ds_f_bits(rec.mq));
        h = ds_combine(h, ((ds_u64)rec.cut_key << 32) | rec.cut_id);
        h = ds_combine(h, ((ds_u64)rec.argmax << 32) | rec.flags);
    }
    if (o.kind == 0u && o.draw != VF_DRAW_NONE &&
        !(o.draw == VF_DRAW_P && (rows[o.j].flags & VF_TOPK))) {
        const VfResid *rs = (const VfResid *)p.resid + (ds_u64)r * p.nchunks;
        for (ds_u32 c = 0; c < p.nchunks; c++) {
            h = ds_combine(h, ((ds_u64)ds_f_bits(rs[c].rsum) << 32) | ds_f_bits(rs[c].msum));
        }
    }
    return h;
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_vf_pick(const VfParams p) {
    __shared__ VfOutcome o_sh;
    __shared__ VfPickShared sh;
    __shared__ DsRadixShared rsh;
    const ds_u32 r = blockIdx.x, W = p.width;
    if (threadIdx.x == 0) o_sh = vf_walk(p, r);
    __syncthreads();
    VfOutcome o = o_sh;
    if (o.kind == 0u && o.draw != VF_DRAW_NONE) {
        o.last = vf_draw(p, r, o, &sh, &rsh);
    }
    if (threadIdx.x == 0) {
        long long *out = (long long *)p.out + (ds_u64)r * (W + 4u);
        for (ds_u32 k = 0; k < W; k++) out[k] = -1;
        for (ds_u32 k = 0; k < o.accepted; k++) out[k] = vf_token(p, r, k);
        if (o.kind == 0u && o.last >= 0) out[o.accepted] = o.last;
        out[W] = (long long)o.accepted;
        out[W + 1u] = o.kind ? (long long)(((ds_u64)o.kind << 32) | o.pos) : 0;
        out[W + 2u] = o.detail;
        out[W + 3u] = (long long)vf_witness(p, r, o);
    }
}

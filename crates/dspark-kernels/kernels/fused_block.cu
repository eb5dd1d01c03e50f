// The fused Markov block sampler: K slots in at most 2K + 1 launches.
//
// Dense (every valid draft column):
//   dspark_sb_prep    grid (chunks of V_t, B*K): draft-logit rows to -inf (sampled with a
//                     d2t table: the slots then scatter into them).
//   per slot k:
//   dspark_sb_bias    grid (chunks of 1024 columns): per column d and request b,
//                     l = mult * (base[b,k,d] + W2[d] . W1[prev_b]) (W2 read once per tile of
//                     8 requests, in its own dtype), written to the draft logits (sampled), and
//                     per (request, chunk) statistics: max, first argmax, NaNs, sum exp(l - max).
//   dspark_sb_pick    grid (B): merges the chunks, checks the row, takes the argmax or draws with
//                     the request's counter-based uniform (chunks, then 4-column segments, then
//                     columns, in id order), maps the id, writes the token and W1[prev] and
//                     moves prev on.
//   dspark_sb_onehot  grid (chunks of V_t, B*K): greedy rows become one-hot (0 at the token).
// Top-k candidate walk:
//   dspark_sb_topk    grid (B*K): checks each base row, selects its top-k (radix selection) as
//                     an id-ordered candidate list, sets the draft-logit row to -inf.
//   dspark_sb_pick    per slot, in its top-k form: biases the candidates only, checks them,
//                     picks (exact f64 weights over the list, in id order).
//
// The parameter block carries every request's stream and anchor by value. Results: tokens and
// status words per (b, k), a witness hash per request of every merge it made. The Rust model is
// crates/dspark-kernels/src/sampling/fused/block.rs.
#include "fused_common.cuh"

#define SB_MAXB 256
#define SB_CH 1024                  // draft columns per bias block
#define SB_CPT (SB_CH / DS_NT)      // columns per thread (strided)
#define SB_BT 8                     // requests per tile of the bias block
#define SB_RMAX 512                 // largest Markov rank of the fused sampler
#define SB_FILL 8192                // target columns per fill block

// Status words.
#define SB_ERR_NONFINITE 1u       // NaN or +inf in the draft logits
#define SB_ERR_NOFINITE 2u        // no finite draft logit in the valid vocabulary
#define SB_ERR_BASE_NONFINITE 3u  // NaN or +inf in the base logits (top-k)
#define SB_ERR_BASE_NOFINITE 4u   // no finite base logit (top-k)

struct SbParams {
    ds_u64 base, w1, w2, table, out, emb, tokens, prev, stats, cand, ncand, status, witness;
    ds_u32 batch, slots, vocab_d, vocab_t, valid, rank, nchunks, slot;
    ds_u32 dt_base, dt_w1, dt_w2, greedy, top_k, has_table, pad0, pad1;
    float mult;
    ds_u32 pad2;
    ds_u64 stream[SB_MAXB];
    ds_u32 anchor[SB_MAXB];
};

struct SbChunk {
    float max;
    ds_u32 argmax;
    ds_u32 nans;
    float sum;
};

static_assert(sizeof(SbParams) == 176 + 12 * SB_MAXB, "SbParams layout");
static_assert(sizeof(SbChunk) == 16, "SbChunk layout");

__device__ __forceinline__ ds_u32 sb_map(const SbParams &p, ds_u32 d) {
    return p.has_table ? ((const ds_u32 *)p.table)[d] : d;
}

// The token slot k conditions on: the anchor, then the previous slot's token.
__device__ __forceinline__ ds_u32 sb_prev(const SbParams &p, ds_u32 b) {
    return p.slot == 0u ? p.anchor[b] : ((const ds_u32 *)p.prev)[b];
}

__device__ __forceinline__ float *sb_row(const SbParams &p, ds_u32 b, ds_u32 k) {
    return (float *)p.out + ((ds_u64)b * p.slots + k) * p.vocab_t;
}

// ---- dspark_sb_prep / dspark_sb_onehot ----------------------------------------------------

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_sb_prep(const SbParams p) {
    const ds_u32 bk = blockIdx.y, start = blockIdx.x * SB_FILL;
    float *row = (float *)p.out + (ds_u64)bk * p.vocab_t;
    for (ds_u32 j = threadIdx.x; j < SB_FILL; j += DS_NT) {
        const ds_u32 v = start + j;
        if (v < p.vocab_t) row[v] = DS_NINF;
    }
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_sb_onehot(const SbParams p) {
    const ds_u32 bk = blockIdx.y, start = blockIdx.x * SB_FILL;
    const ds_u32 tok = ((const ds_u32 *)p.tokens)[bk];
    float *row = (float *)p.out + (ds_u64)bk * p.vocab_t;
    for (ds_u32 j = threadIdx.x; j < SB_FILL; j += DS_NT) {
        const ds_u32 v = start + j;
        if (v < p.vocab_t) row[v] = v == tok ? 0.0f : DS_NINF;
    }
}

// ---- dspark_sb_bias ------------------------------------------------------------------------

// acc[bb] = fma(W2[d][jj], e[bb][jj], acc[bb]) for jj in [j0, j0 + n), in order, W2's values
// read `n` at a time with one 16-byte load when `vec` (the row slice is 16-byte aligned).
template <int N>
__device__ __forceinline__ void sb_dot_run(const float *w, float acc[SB_BT], float e[SB_BT][SB_RMAX],
                                           ds_u32 j0) {
#pragma unroll
    for (int q = 0; q < N; q++) {
#pragma unroll
        for (int bb = 0; bb < SB_BT; bb++) acc[bb] = fmaf(w[q], e[bb][j0 + q], acc[bb]);
    }
}

__device__ __forceinline__ void sb_dot(const SbParams &p, ds_u32 d, bool vec, float acc[SB_BT],
                                       float e[SB_BT][SB_RMAX]) {
    const ds_u32 r = p.rank;
    const ds_u64 at = (ds_u64)d * r;
    if (vec && p.dt_w2 == DS_F32) {
        for (ds_u32 jj = 0; jj < r; jj += 4) {
            float w[4];
            ds_load16(w, (const float *)p.w2 + at + jj);
            sb_dot_run<4>(w, acc, e, jj);
        }
    } else if (vec) {
        for (ds_u32 jj = 0; jj < r; jj += 8) {
            unsigned short h[8];
            ds_load16(h, (const unsigned short *)p.w2 + at + jj);
            float w[8];
#pragma unroll
            for (int q = 0; q < 8; q++)
                w[q] = p.dt_w2 == DS_BF16 ? ds_bits_f((ds_u32)h[q] << 16) : ds_f16(h[q]);
            sb_dot_run<8>(w, acc, e, jj);
        }
    } else {
        for (ds_u32 jj = 0; jj < r; jj++) {
            const float w = ds_load_dt((const void *)p.w2, at + jj, p.dt_w2);
#pragma unroll
            for (int bb = 0; bb < SB_BT; bb++) acc[bb] = fmaf(w, e[bb][jj], acc[bb]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_sb_bias(const SbParams p) {
    __shared__ float e[SB_BT][SB_RMAX];
    __shared__ float shf[DS_WARPS];
    __shared__ ds_u32 shu[DS_WARPS];
    const ds_u32 c = blockIdx.x, t = threadIdx.x, r = p.rank, k = p.slot;
    const bool sampled = !p.greedy;
    // 16-byte loads of W2's rows when every row starts 16-byte aligned.
    const ds_u32 esize = p.dt_w2 == DS_F32 ? 4u : 2u;
    const bool vec = r > 0u && (p.w2 % 16u) == 0u && (r * esize) % 16u == 0u;
    for (ds_u32 b0 = 0; b0 < p.batch; b0 += SB_BT) {
        const ds_u32 nb = p.batch - b0 < SB_BT ? p.batch - b0 : SB_BT;
        for (ds_u32 i = t; i < nb * r; i += DS_NT) {
            const ds_u32 bb = i / r, jj = i % r;
            e[bb][jj] = ds_load_dt((const void *)p.w1, (ds_u64)sb_prev(p, b0 + bb) * r + jj, p.dt_w1);
        }
        __syncthreads();
        float l[SB_BT][SB_CPT];
#pragma unroll
        for (int j = 0; j < SB_CPT; j++) {
            const ds_u32 d = c * SB_CH + t + (ds_u32)j * DS_NT;
            float acc[SB_BT];
#pragma unroll
            for (int bb = 0; bb < SB_BT; bb++) acc[bb] = 0.0f;
            if (d < p.valid) sb_dot(p, d, vec, acc, e);
#pragma unroll
            for (int bb = 0; bb < SB_BT; bb++) {
                l[bb][j] = DS_NINF;
                if (d < p.valid && (ds_u32)bb < nb) {
                    const float x = ds_load_dt((const void *)p.base,
                                               ((ds_u64)(b0 + bb) * p.slots + k) * p.vocab_d + d, p.dt_base);
                    l[bb][j] = p.mult * (x + acc[bb]);
                    if (sampled) sb_row(p, b0 + bb, k)[sb_map(p, d)] = l[bb][j];
                }
            }
        }
#pragma unroll
        for (int bb = 0; bb < SB_BT; bb++) {
            if ((ds_u32)bb >= nb) break;  // uniform: nb is the same in every thread
            float lmax = DS_NINF;
            ds_u32 larg = DS_NONE, nans = 0;
#pragma unroll
            for (int j = 0; j < SB_CPT; j++) {
                const ds_u32 d = c * SB_CH + t + (ds_u32)j * DS_NT;
                const float v = l[bb][j];
                if (d >= p.valid) continue;
                if (v != v) nans++;
                else if (v > lmax) {
                    lmax = v;
                    larg = d;
                }
            }
            const float m = ds_block_max(lmax, shf);
            ds_u32 am = ds_block_min_u32(lmax == m && m > DS_NINF ? larg : DS_NONE, shu);
            if (am == DS_NONE) am = c * SB_CH;
            const ds_u32 nn = ds_block_sum_u32(nans, shu);
            float sum = 0.0f;
            if (sampled && m > DS_NINF && m < DS_INF) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < SB_CPT; j++) {
                    const ds_u32 d = c * SB_CH + t + (ds_u32)j * DS_NT;
                    if (d < p.valid) acc = acc + ds_exp(l[bb][j] - m);
                }
                sum = ds_block_sum(acc, shf);
            }
            if (t == 0) {
                SbChunk s;
                s.max = m;
                s.argmax = am;
                s.nans = nn;
                s.sum = sum;
                ((SbChunk *)p.stats)[(ds_u64)(b0 + bb) * p.nchunks + c] = s;
            }
        }
        __syncthreads();
    }
}

// ---- dspark_sb_pick ------------------------------------------------------------------------

struct SbPickShared {
    double segs[DS_NT];
    double z, draw, before, scale;
    float m, cmax;
    ds_u32 prev, chunk, seg, d, status;
    int found;
};

__device__ __forceinline__ float sb_l(const SbParams &p, ds_u32 b, ds_u32 d) {
    return sb_row(p, b, p.slot)[sb_map(p, d)];
}

// Statuses and witness of slot k for request b, written by thread 0.
// (In the top-k form a base-row error, written by dspark_sb_topk, stays.)
__device__ __forceinline__ void sb_finish(const SbParams &p, ds_u32 b, ds_u32 d, ds_u32 status,
                                          float m, double z) {
    const ds_u32 k = p.slot;
    const ds_u32 tok = sb_map(p, d);
    ((ds_u32 *)p.tokens)[(ds_u64)b * p.slots + k] = tok;
    ds_u32 *st = (ds_u32 *)p.status + (ds_u64)b * p.slots + k;
    if (!p.top_k || *st == 0u) *st = status;
    ds_u64 *w = (ds_u64 *)p.witness + b;
    ds_u64 h = k == 0u ? 0x452821e638d01377ull : *w;
    h = ds_combine(h, ((ds_u64)ds_f_bits(m) << 32) | tok);
    h = ds_combine(h, (ds_u64)__double_as_longlong(z));
    *w = h;
}

// The previous token's W1 row as this slot's embedding, then prev moves on (after every
// thread has read it).
__device__ __forceinline__ void sb_advance(const SbParams &p, ds_u32 b, ds_u32 prev, ds_u32 d) {
    const ds_u32 r = p.rank, k = p.slot;
    float *emb = (float *)p.emb + ((ds_u64)b * p.slots + k) * r;
    for (ds_u32 jj = threadIdx.x; jj < r; jj += DS_NT)
        emb[jj] = ds_load_dt((const void *)p.w1, (ds_u64)prev * r + jj, p.dt_w1);
    __syncthreads();
    if (threadIdx.x == 0) ((ds_u32 *)p.prev)[b] = sb_map(p, d);
}

__device__ __forceinline__ void sb_pick_dense(const SbParams &p, ds_u32 b, SbPickShared *sh) {
    const ds_u32 t = threadIdx.x;
    if (t == 0) {
        const SbChunk *ch = (const SbChunk *)p.stats + (ds_u64)b * p.nchunks;
        float best = DS_NINF;
        ds_u32 arg = 0, nn = 0;
        for (ds_u32 c = 0; c < p.nchunks; c++) {
            nn += ch[c].nans;
            if (ch[c].max > best) {
                best = ch[c].max;
                arg = ch[c].argmax;
            }
        }
        ds_u32 status = 0;
        if (nn > 0u || best == DS_INF) status = SB_ERR_NONFINITE;
        else if (!(best > DS_NINF)) status = SB_ERR_NOFINITE;
        double z = 0.0;
        if (!p.greedy && status == 0u) {
            for (ds_u32 c = 0; c < p.nchunks; c++)
                if (ch[c].sum > 0.0f) z = z + (double)ch[c].sum * (double)ds_exp(ch[c].max - best);
        }
        sh->m = best;
        sh->d = arg;
        sh->status = status;
        sh->found = 0;
        sh->z = z;
        if (!p.greedy && status == 0u && z > 0.0) {
            const double u = ds_uniform(p.stream[b], DS_SALT_DRAFT, p.slot);
            const double target = u * z;
            ds_u32 chosen;
            ds_walk(
                p.nchunks,
                [&](ds_u32 c) {
                    return ch[c].sum > 0.0f ? (double)ch[c].sum * (double)ds_exp(ch[c].max - best) : 0.0;
                },
                0.0, target, &chosen, &sh->before);
            sh->chunk = chosen;
            sh->cmax = ch[chosen].max;
            sh->scale = (double)ds_exp(ch[chosen].max - best);
            sh->found = 1;
            sh->draw = target;
        }
    }
    __syncthreads();
    if (sh->found) {
        const double target = sh->draw;
        const ds_u32 lo = sh->chunk * SB_CH + t * SB_CPT;
        double seg = 0.0;
        for (ds_u32 j = 0; j < SB_CPT; j++) {
            const ds_u32 d = lo + j;
            if (d >= p.valid) break;
            seg = seg + (double)ds_exp(sb_l(p, b, d) - sh->cmax) * sh->scale;
        }
        sh->segs[t] = seg;
        __syncthreads();
        if (t == 0) {
            double at_pre;
            ds_walk(DS_NT, [&](ds_u32 q) { return sh->segs[q]; }, sh->before, target, &sh->seg,
                    &at_pre);
            sh->before = at_pre;
        }
        __syncthreads();
        if (t == sh->seg) {
            double acc = sh->before;
            int last = -1;
            for (ds_u32 j = 0; j < SB_CPT; j++) {
                const ds_u32 d = lo + j;
                if (d >= p.valid) break;
                const double w = (double)ds_exp(sb_l(p, b, d) - sh->cmax) * sh->scale;
                if (w > 0.0) {
                    acc = acc + w;
                    last = (int)d;
                    if (acc > target) break;
                }
            }
            if (last >= 0) sh->d = (ds_u32)last;
        }
        __syncthreads();
    }
    if (t == 0) sb_finish(p, b, sh->d, sh->status, sh->m, sh->z);
}

__device__ __forceinline__ void sb_pick_topk(const SbParams &p, ds_u32 b, ds_u32 prev, SbPickShared *sh) {
    __shared__ float e[SB_RMAX];
    const ds_u32 t = threadIdx.x, r = p.rank, k = p.slot;
    const ds_u32 bk = b * p.slots + k;
    const ds_u32 n = ((const ds_u32 *)p.ncand)[bk];
    const ds_u32 *cand = (const ds_u32 *)p.cand + (ds_u64)bk * p.top_k;
    for (ds_u32 jj = t; jj < r; jj += DS_NT)
        e[jj] = ds_load_dt((const void *)p.w1, (ds_u64)prev * r + jj, p.dt_w1);
    __syncthreads();
    float *row = sb_row(p, b, k);
    for (ds_u32 i = t; i < n; i += DS_NT) {
        const ds_u32 d = cand[i];
        float acc = 0.0f;
        for (ds_u32 jj = 0; jj < r; jj++)
            acc = fmaf(ds_load_dt((const void *)p.w2, (ds_u64)d * r + jj, p.dt_w2), e[jj], acc);
        const float x = ds_load_dt((const void *)p.base, (ds_u64)bk * p.vocab_d + d, p.dt_base);
        row[sb_map(p, d)] = p.mult * (x + acc);
    }
    __syncthreads();
    if (t == 0) {
        float best = DS_NINF;
        ds_u32 j = 0, nans = 0;
        for (ds_u32 i = 0; i < n; i++) {
            const float v = row[sb_map(p, cand[i])];
            if (v != v) nans++;
            else if (v > best) {
                best = v;
                j = i;
            }
        }
        ds_u32 status = 0;
        if (nans > 0u || best == DS_INF) status = SB_ERR_NONFINITE;
        else if (!(best > DS_NINF)) status = SB_ERR_NOFINITE;
        double z = 0.0;
        if (!p.greedy && status == 0u) {
            for (ds_u32 i = 0; i < n; i++) z = z + (double)ds_exp(row[sb_map(p, cand[i])] - best);
            const double target = ds_uniform(p.stream[b], DS_SALT_DRAFT, k) * z;
            double acc = 0.0;
            int last = -1;
            for (ds_u32 i = 0; i < n; i++) {
                const double w = (double)ds_exp(row[sb_map(p, cand[i])] - best);
                if (w > 0.0) {
                    last = (int)i;
                    acc = acc + w;
                    if (acc > target) break;
                }
            }
            if (last >= 0) j = (ds_u32)last;
        }
        sh->d = n > 0u ? cand[j] : 0u;
        sh->status = status;
        sh->m = best;
        sh->z = z;
    }
    __syncthreads();
    if (p.greedy) {
        for (ds_u32 i = t; i < n; i += DS_NT) row[sb_map(p, cand[i])] = DS_NINF;
        __syncthreads();
        if (t == 0) row[sb_map(p, sh->d)] = 0.0f;
    }
    if (t == 0) sb_finish(p, b, sh->d, sh->status, sh->m, sh->z);
}

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_sb_pick(const SbParams p) {
    __shared__ SbPickShared sh;
    const ds_u32 b = blockIdx.x;
    if (threadIdx.x == 0) sh.prev = sb_prev(p, b);
    __syncthreads();
    const ds_u32 prev = sh.prev;
    if (p.top_k) sb_pick_topk(p, b, prev, &sh);
    else sb_pick_dense(p, b, &sh);
    __syncthreads();
    sb_advance(p, b, prev, sh.d);
}

// ---- dspark_sb_topk ------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(DS_NT) dspark_sb_topk(const SbParams p) {
    __shared__ DsRadixShared rsh;
    __shared__ float shf[DS_WARPS];
    __shared__ ds_u32 shu[DS_WARPS];
    __shared__ ds_u32 seg[DS_NT];
    const ds_u32 bk = blockIdx.x, t = threadIdx.x;
    const ds_u64 off = (ds_u64)bk * p.vocab_d;
    float lmax = DS_NINF;
    ds_u32 nans = 0;
    for (ds_u32 v = t; v < p.valid; v += DS_NT) {
        const float x = ds_load_dt((const void *)p.base, off + v, p.dt_base);
        if (x != x) nans++;
        else if (x > lmax) lmax = x;
    }
    const float m = ds_block_max(lmax, shf);
    const ds_u32 nn = ds_block_sum_u32(nans, shu);
    ds_u32 status = 0;
    if (nn > 0u || m == DS_INF) status = SB_ERR_BASE_NONFINITE;
    else if (!(m > DS_NINF)) status = SB_ERR_BASE_NOFINITE;
    float *row = (float *)p.out + (ds_u64)bk * p.vocab_t;
    for (ds_u32 v = t; v < p.vocab_t; v += DS_NT) row[v] = DS_NINF;
    ds_u32 *cand = (ds_u32 *)p.cand + (ds_u64)bk * p.top_k;
    if (status != 0u) {
        if (t == 0) {
            ((ds_u32 *)p.status)[bk] = status;
            ((ds_u32 *)p.ncand)[bk] = 0;
        }
        return;
    }
    DsCut none;
    none.key = 0;
    none.id = 0;
    const DsRadix sel = ds_radix((const void *)p.base, off, p.dt_base, p.valid, false, none,
                                 DS_GOAL_COUNT, p.top_k, 1.0f, 0.0, m, 1.0f, &rsh);
    // The kept ids in id order: counts per contiguous segment, their prefix, then the writes.
    const ds_u32 per = (p.valid + DS_NT - 1u) / DS_NT;
    const ds_u32 lo = t * per < p.valid ? t * per : p.valid;
    const ds_u32 hi = lo + per < p.valid ? lo + per : p.valid;
    ds_u32 cnt = 0;
    for (ds_u32 v = lo; v < hi; v++) {
        const float x = ds_load_dt((const void *)p.base, off + v, p.dt_base);
        if (ds_finite_logit(x) && ds_keeps(sel.cut, x, v)) cnt++;
    }
    seg[t] = cnt;
    __syncthreads();
    if (t == 0) {
        ds_u32 pre = 0;
        for (ds_u32 q = 0; q < DS_NT; q++) {
            const ds_u32 c = seg[q];
            seg[q] = pre;
            pre += c;
        }
        ((ds_u32 *)p.ncand)[bk] = pre < p.top_k ? pre : p.top_k;
        ((ds_u32 *)p.status)[bk] = 0u;
    }
    __syncthreads();
    ds_u32 at = seg[t];
    for (ds_u32 v = lo; v < hi; v++) {
        const float x = ds_load_dt((const void *)p.base, off + v, p.dt_base);
        if (ds_finite_logit(x) && ds_keeps(sel.cut, x, v)) {
            if (at < p.top_k) cand[at] = v;
            at++;
        }
    }
}

// FlashAttention-2 forward and backward for cascade's fused attention op (../cuda.rs), compiled
// at run time with NVRTC. Same semantics as the CPU kernel (../cpu.rs): q/o/dO (b, heads, t, d),
// k/v (b, kv_heads, t, d), contiguous; query i attends key j iff both lie in one segment and
// j <= i; rows outside every segment get O = 0, L = +inf and zero gradients; GQA reads kv head
// h / (heads / kv_heads) in place. Inputs f32 or bf16 (raw 16-bit words), all arithmetic f32.
//
// Segments travel as a small device array: `segs` holds (start, end) pairs of every batch row,
// row r's are pairs [seg_off[r], seg_off[r + 1]), sorted and disjoint (checked on the host).
//
// Kernels (one block per (batch row, head, tile), 1-D grid):
//   fa_fwd_*   per (row, head, block of FWD_M queries): O and L = m + log(l), online softmax
//              over the key tiles the block's rows can see.
//   fa_dq_*    per (row, head, block of BWD_M queries): D = rowsum(dO * O) (written for
//              fa_dkdv), then dQ = sum_j dS_ij K_j, recomputing P = exp(S - L) tile by tile.
//   fa_dkdv_*  per (row, kv head, block of BWD_N keys): dV = sum_i P_ij dO_i and
//              dK = sum_i dS_ij Q_i over the query heads of the group and the queries that see
//              the keys. Launched after fa_dq (reads D).
// dQ and dK/dV come from two kernels that each recompute S (no atomics, deterministic).
//
// Layout of the work inside a block (THREADS threads, any multiple of 32 that divides the
// tiles): tiles of q/k/v/dO are staged in shared memory as f32 with rows padded to DMAX + 1
// floats (conflict-free column reads); the score tile is computed one (query, key) pair per
// thread step; accumulators are owned one (row, column) element per thread step, so that a warp
// reads consecutive columns. Shared memory stays under the 48 KB of static shared memory.
//
// These FMA kernels serve f32, and bf16 on GPUs older than compute capability 8.0; bf16 on
// newer ones runs on tensor cores (flash_attn_mma.cu, compiled after this file). What would
// make these faster (not done): register-blocked tiles of 64-128 queries with dynamic shared
// memory above 48 KB, cp.async double buffering of the next K/V tile, exp2 with a folded
// log2(e) scale, and skipping the mask test on tiles fully below the diagonal.

#ifndef THREADS
#define THREADS 128
#endif

typedef unsigned short bf16_bits;

#define FA_OUTSIDE 0xffffffffu

__device__ __forceinline__ float fa_inf() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_bits x) {
    return __int_as_float(static_cast<int>(static_cast<unsigned int>(x) << 16));
}

// Round to nearest even, as `half::bf16::from_f32` (NaN stays a quiet NaN).
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ bf16_bits from_f32<bf16_bits>(float x) {
    unsigned int u = static_cast<unsigned int>(__float_as_int(x));
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16_bits>(u >> 16);
}

// Tile sizes per head-dimension bound (DMAX: 64 or 128; d <= DMAX, columns past d are zero).
template <int DMAX>
struct Tiles;
template <>
struct Tiles<64> {
    static constexpr int FWD_M = 64, FWD_N = 32, BWD_M = 32, BWD_N = 32;
};
template <>
struct Tiles<128> {
    static constexpr int FWD_M = 32, FWD_N = 16, BWD_M = 16, BWD_N = 16;
};

// Static shared memory of each kernel (bytes); a block may use at most 48 KB of it.
template <int DMAX>
struct SharedBytes {
    using T = Tiles<DMAX>;
    static constexpr int fwd = 4 * ((T::FWD_M + 2 * T::FWD_N) * (DMAX + 1) +
                                    T::FWD_M * (T::FWD_N + 1) + 4 * T::FWD_M + 2);
    static constexpr int dq = 4 * ((2 * T::BWD_M + 2 * T::BWD_N) * (DMAX + 1) +
                                   T::BWD_M * (T::BWD_N + 1) + 3 * T::BWD_M + 2);
    static constexpr int dkdv = 4 * ((2 * T::BWD_M + 2 * T::BWD_N) * (DMAX + 1) +
                                     2 * T::BWD_M * (T::BWD_N + 1) + 3 * T::BWD_M + T::BWD_N + 1);
    static_assert(fwd <= 48 * 1024 && dq <= 48 * 1024 && dkdv <= 48 * 1024,
                  "static shared memory over 48 KB");
};
template struct SharedBytes<64>;
template struct SharedBytes<128>;

// Index of the segment of row `row` holding position i, or -1.
__device__ __forceinline__ int fa_segment(const unsigned int* seg_off, const unsigned int* segs,
                                          unsigned int row, unsigned int i) {
    unsigned int lo = seg_off[row], hi = seg_off[row + 1];
    const unsigned int last = hi;
    while (lo < hi) {  // first segment whose end is past i
        const unsigned int mid = lo + (hi - lo) / 2;
        if (segs[2 * mid + 1] <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < last && segs[2 * lo] <= i) return static_cast<int>(lo);
    return -1;
}

// Start of the segment holding position i (FA_OUTSIDE if none).
__device__ __forceinline__ unsigned int fa_start(const unsigned int* seg_off,
                                                 const unsigned int* segs, unsigned int row,
                                                 unsigned int i) {
    const int s = fa_segment(seg_off, segs, row, i);
    return s < 0 ? FA_OUTSIDE : segs[2 * s];
}

// The end of the queries that can see a key of [k0, k0 + n) of batch row `row`: the largest
// segment end of those keys (0 if none; keys at or past t count as none). `key_end` (n entries
// of shared memory) is scratch and `q_hi` a shared slot; every thread of the block (of
// `threads`) calls it, and it ends with a barrier, so writes to shared memory made before the
// call are visible after it.
__device__ __forceinline__ unsigned int fa_keys_seen_until(const unsigned int* seg_off,
                                                           const unsigned int* segs,
                                                           unsigned int row, unsigned int k0,
                                                           unsigned int n, unsigned int t,
                                                           unsigned int* key_end,
                                                           unsigned int* q_hi,
                                                           unsigned int threads) {
    for (unsigned int r = threadIdx.x; r < n; r += threads) {
        const unsigned int j = k0 + r;
        const int s = j < t ? fa_segment(seg_off, segs, row, j) : -1;
        key_end[r] = s < 0 ? 0u : segs[2 * s + 1];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int e = 0;
        for (unsigned int j = 0; j < n; ++j) e = key_end[j] > e ? key_end[j] : e;
        *q_hi = e;
    }
    __syncthreads();
    return *q_hi;
}

// rows x DMAX elements of `src` (row stride d, rows [row0, row0 + rows) of a (t, d) matrix)
// into `dst` (row stride DMAX + 1) as f32; zero past t and past d.
template <class T, int DMAX, int ROWS>
__device__ __forceinline__ void fa_load_tile(float (*dst)[DMAX + 1], const T* src,
                                             unsigned int row0, unsigned int t, unsigned int d) {
    for (unsigned int e = threadIdx.x; e < ROWS * DMAX; e += THREADS) {
        const unsigned int r = e / DMAX, c = e % DMAX;
        const unsigned int i = row0 + r;
        dst[r][c] = (i < t && c < d) ? to_f32(src[static_cast<unsigned long long>(i) * d + c])
                                     : 0.0f;
    }
}

template <int DMAX>
__device__ __forceinline__ float fa_dot(const float* a, const float* b) {
    float s = 0.0f;
#pragma unroll 8
    for (int c = 0; c < DMAX; ++c) s += a[c] * b[c];
    return s;
}

// ------------------------------------------------------------------------------------------
// Forward.

template <class T, int DMAX>
__device__ __forceinline__ void fa_fwd(const T* q, const T* k, const T* v,
                                       const unsigned int* seg_off, const unsigned int* segs,
                                       T* out, float* lse, unsigned int heads,
                                       unsigned int kv_heads, unsigned int t, unsigned int d,
                                       float scale, unsigned int q_blocks) {
    constexpr int BM = Tiles<DMAX>::FWD_M, BN = Tiles<DMAX>::FWD_N;
    constexpr int ACC = BM * DMAX / THREADS;
    static_assert(BM * DMAX % THREADS == 0, "accumulator elements must split evenly");
    __shared__ float qs[BM][DMAX + 1];
    __shared__ float ks[BN][DMAX + 1];
    __shared__ float vs[BN][DMAX + 1];
    __shared__ float ss[BM][BN + 1];
    __shared__ unsigned int starts[BM];
    __shared__ float m_row[BM], l_row[BM], corr[BM];
    __shared__ unsigned int range[2];

    // Heaviest (last) query blocks first: causal blocks near the end see the most keys.
    const unsigned int qb = q_blocks - 1 - blockIdx.x % q_blocks;
    const unsigned int bh = blockIdx.x / q_blocks;
    const unsigned int row = bh / heads, h = bh % heads;
    const unsigned int kvh = row * kv_heads + h / (heads / kv_heads);
    const unsigned int q0 = qb * BM;
    const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
    const unsigned long long kv_off = static_cast<unsigned long long>(kvh) * t * d;
    const unsigned int tid = threadIdx.x;

    for (unsigned int r = tid; r < BM; r += THREADS) {
        const unsigned int i = q0 + r;
        starts[r] = i < t ? fa_start(seg_off, segs, row, i) : FA_OUTSIDE;
        m_row[r] = -fa_inf();
        l_row[r] = 0.0f;
    }
    fa_load_tile<T, DMAX, BM>(qs, q + head_off, q0, t, d);
    __syncthreads();
    if (tid == 0) {
        unsigned int lo = FA_OUTSIDE, hi = 0;
        for (int r = 0; r < BM; ++r) {
            if (starts[r] == FA_OUTSIDE) continue;
            lo = starts[r] < lo ? starts[r] : lo;
            hi = q0 + r + 1;
        }
        range[0] = lo;
        range[1] = hi;
    }
    __syncthreads();
    const unsigned int lo = range[0], hi = range[1];

    float acc[ACC];
#pragma unroll
    for (int a = 0; a < ACC; ++a) acc[a] = 0.0f;

    for (unsigned int k0 = lo; k0 < hi; k0 += BN) {
        fa_load_tile<T, DMAX, BN>(ks, k + kv_off, k0, t, d);
        fa_load_tile<T, DMAX, BN>(vs, v + kv_off, k0, t, d);
        __syncthreads();
        // Scores of visible pairs, -inf elsewhere.
        for (unsigned int e = tid; e < BM * BN; e += THREADS) {
            const unsigned int r = e / BN, j = e % BN;
            const unsigned int i = q0 + r, key = k0 + j;
            const bool visible = starts[r] != FA_OUTSIDE && key >= starts[r] && key <= i;
            ss[r][j] = visible ? fa_dot<DMAX>(qs[r], ks[j]) * scale : -fa_inf();
        }
        __syncthreads();
        // Online softmax, one thread per row.
        for (unsigned int r = tid; r < BM; r += THREADS) {
            float tile_max = -fa_inf();
            for (int j = 0; j < BN; ++j) tile_max = fmaxf(tile_max, ss[r][j]);
            const float m_old = m_row[r];
            const float m_new = fmaxf(m_old, tile_max);
            if (m_new == -fa_inf()) {  // nothing visible yet
                for (int j = 0; j < BN; ++j) ss[r][j] = 0.0f;
                corr[r] = 1.0f;
            } else {
                float sum = 0.0f;
                for (int j = 0; j < BN; ++j) {
                    const float p = expf(ss[r][j] - m_new);
                    ss[r][j] = p;
                    sum += p;
                }
                const float c = expf(m_old - m_new);
                corr[r] = c;
                l_row[r] = l_row[r] * c + sum;
                m_row[r] = m_new;
            }
        }
        __syncthreads();
        // acc = acc * corr + P V. Keys outermost and not unrolled, accumulators unrolled (in
        // registers): small code, the same summation order per element.
#pragma unroll
        for (int a = 0; a < ACC; ++a) acc[a] *= corr[(tid + a * THREADS) / DMAX];
#pragma unroll 1
        for (int j = 0; j < BN; ++j) {
#pragma unroll
            for (int a = 0; a < ACC; ++a) {
                const unsigned int e = tid + a * THREADS;
                acc[a] += ss[e / DMAX][j] * vs[j][e % DMAX];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int a = 0; a < ACC; ++a) {
        const unsigned int e = tid + a * THREADS;
        const unsigned int r = e / DMAX, c = e % DMAX;
        const unsigned int i = q0 + r;
        if (i >= t || c >= d) continue;
        const float l = l_row[r];
        out[head_off + static_cast<unsigned long long>(i) * d + c] =
            from_f32<T>(l > 0.0f ? acc[a] / l : 0.0f);
    }
    for (unsigned int r = tid; r < BM; r += THREADS) {
        if (q0 + r >= t) continue;
        const float l = l_row[r];
        lse[static_cast<unsigned long long>(bh) * t + q0 + r] =
            l > 0.0f ? m_row[r] + logf(l) : fa_inf();
    }
}

// ------------------------------------------------------------------------------------------
// Backward: dQ (and D).

template <class T, int DMAX>
__device__ __forceinline__ void fa_dq(const T* q, const T* k, const T* v, const T* o,
                                      const T* d_o, const float* lse,
                                      const unsigned int* seg_off, const unsigned int* segs,
                                      T* dq, float* delta, unsigned int heads,
                                      unsigned int kv_heads, unsigned int t, unsigned int d,
                                      float scale, unsigned int q_blocks) {
    constexpr int BM = Tiles<DMAX>::BWD_M, BN = Tiles<DMAX>::BWD_N;
    constexpr int ACC = BM * DMAX / THREADS;
    static_assert(BM * DMAX % THREADS == 0, "accumulator elements must split evenly");
    __shared__ float qs[BM][DMAX + 1];
    __shared__ float gs[BM][DMAX + 1];  // dO
    __shared__ float ks[BN][DMAX + 1];
    __shared__ float vs[BN][DMAX + 1];
    __shared__ float ds[BM][BN + 1];
    __shared__ unsigned int starts[BM];
    __shared__ float lse_row[BM], delta_row[BM];
    __shared__ unsigned int range[2];

    const unsigned int qb = q_blocks - 1 - blockIdx.x % q_blocks;
    const unsigned int bh = blockIdx.x / q_blocks;
    const unsigned int row = bh / heads, h = bh % heads;
    const unsigned int kvh = row * kv_heads + h / (heads / kv_heads);
    const unsigned int q0 = qb * BM;
    const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
    const unsigned long long kv_off = static_cast<unsigned long long>(kvh) * t * d;
    const unsigned int tid = threadIdx.x;

    fa_load_tile<T, DMAX, BM>(qs, q + head_off, q0, t, d);
    fa_load_tile<T, DMAX, BM>(gs, d_o + head_off, q0, t, d);
    __syncthreads();
    for (unsigned int r = tid; r < BM; r += THREADS) {
        const unsigned int i = q0 + r;
        float dsum = 0.0f;
        unsigned int start = FA_OUTSIDE;
        if (i < t) {
            start = fa_start(seg_off, segs, row, i);
            const T* o_i = o + head_off + static_cast<unsigned long long>(i) * d;
            for (unsigned int c = 0; c < d; ++c) dsum += to_f32(o_i[c]) * gs[r][c];
            delta[static_cast<unsigned long long>(bh) * t + i] = dsum;
            lse_row[r] = lse[static_cast<unsigned long long>(bh) * t + i];
        } else {
            lse_row[r] = fa_inf();
        }
        starts[r] = start;
        delta_row[r] = dsum;
    }
    __syncthreads();
    if (tid == 0) {
        unsigned int lo = FA_OUTSIDE, hi = 0;
        for (int r = 0; r < BM; ++r) {
            if (starts[r] == FA_OUTSIDE) continue;
            lo = starts[r] < lo ? starts[r] : lo;
            hi = q0 + r + 1;
        }
        range[0] = lo;
        range[1] = hi;
    }
    __syncthreads();
    const unsigned int lo = range[0], hi = range[1];

    float acc[ACC];
#pragma unroll
    for (int a = 0; a < ACC; ++a) acc[a] = 0.0f;

    for (unsigned int k0 = lo; k0 < hi; k0 += BN) {
        fa_load_tile<T, DMAX, BN>(ks, k + kv_off, k0, t, d);
        fa_load_tile<T, DMAX, BN>(vs, v + kv_off, k0, t, d);
        __syncthreads();
        // dS = P * (dP - D) * scale with P = exp(S - L), dP = dO V^T; zero where invisible.
        for (unsigned int e = tid; e < BM * BN; e += THREADS) {
            const unsigned int r = e / BN, j = e % BN;
            const unsigned int i = q0 + r, key = k0 + j;
            float x = 0.0f;
            if (starts[r] != FA_OUTSIDE && key >= starts[r] && key <= i) {
                const float p = expf(fa_dot<DMAX>(qs[r], ks[j]) * scale - lse_row[r]);
                const float dp = fa_dot<DMAX>(gs[r], vs[j]);
                x = p * (dp - delta_row[r]) * scale;
            }
            ds[r][j] = x;
        }
        __syncthreads();
#pragma unroll 1
        for (int j = 0; j < BN; ++j) {
#pragma unroll
            for (int a = 0; a < ACC; ++a) {
                const unsigned int e = tid + a * THREADS;
                acc[a] += ds[e / DMAX][j] * ks[j][e % DMAX];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int a = 0; a < ACC; ++a) {
        const unsigned int e = tid + a * THREADS;
        const unsigned int r = e / DMAX, c = e % DMAX;
        const unsigned int i = q0 + r;
        if (i >= t || c >= d) continue;
        dq[head_off + static_cast<unsigned long long>(i) * d + c] = from_f32<T>(acc[a]);
    }
}

// ------------------------------------------------------------------------------------------
// Backward: dK and dV.

template <class T, int DMAX>
__device__ __forceinline__ void fa_dkdv(const T* q, const T* k, const T* v, const T* d_o,
                                        const float* lse, const float* delta,
                                        const unsigned int* seg_off, const unsigned int* segs,
                                        T* dk, T* dv, unsigned int heads, unsigned int kv_heads,
                                        unsigned int t, unsigned int d, float scale,
                                        unsigned int k_blocks) {
    constexpr int BM = Tiles<DMAX>::BWD_M, BN = Tiles<DMAX>::BWD_N;
    constexpr int ACC = BN * DMAX / THREADS;
    static_assert(BN * DMAX % THREADS == 0, "accumulator elements must split evenly");
    __shared__ float ks[BN][DMAX + 1];
    __shared__ float vs[BN][DMAX + 1];
    __shared__ float qs[BM][DMAX + 1];
    __shared__ float gs[BM][DMAX + 1];  // dO
    __shared__ float ps[BM][BN + 1];
    __shared__ float ds[BM][BN + 1];
    __shared__ unsigned int starts[BM];
    __shared__ float lse_row[BM], delta_row[BM];
    __shared__ unsigned int key_end[BN];
    __shared__ unsigned int q_hi;

    // Lowest key blocks first: they are seen by the most queries.
    const unsigned int kb = blockIdx.x % k_blocks;
    const unsigned int bg = blockIdx.x / k_blocks;  // row * kv_heads + kv head
    const unsigned int row = bg / kv_heads;
    const unsigned int rep = heads / kv_heads;
    const unsigned int k0 = kb * BN;
    const unsigned long long kv_off = static_cast<unsigned long long>(bg) * t * d;
    const unsigned int tid = threadIdx.x;

    fa_load_tile<T, DMAX, BN>(ks, k + kv_off, k0, t, d);
    fa_load_tile<T, DMAX, BN>(vs, v + kv_off, k0, t, d);
    // Queries [k0, hi) can see a key of this block.
    const unsigned int hi = fa_keys_seen_until(seg_off, segs, row, k0, BN, t, key_end, &q_hi,
                                               THREADS);

    float dk_acc[ACC], dv_acc[ACC];
#pragma unroll
    for (int a = 0; a < ACC; ++a) {
        dk_acc[a] = 0.0f;
        dv_acc[a] = 0.0f;
    }

    for (unsigned int g = 0; g < rep; ++g) {
        const unsigned int bh = bg * rep + g;  // (row * heads + query head)
        const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
        for (unsigned int q0 = k0; q0 < hi; q0 += BM) {
            fa_load_tile<T, DMAX, BM>(qs, q + head_off, q0, t, d);
            fa_load_tile<T, DMAX, BM>(gs, d_o + head_off, q0, t, d);
            for (unsigned int r = tid; r < BM; r += THREADS) {
                const unsigned int i = q0 + r;
                const bool in = i < t;
                starts[r] = in ? fa_start(seg_off, segs, row, i) : FA_OUTSIDE;
                lse_row[r] = in ? lse[static_cast<unsigned long long>(bh) * t + i] : fa_inf();
                delta_row[r] = in ? delta[static_cast<unsigned long long>(bh) * t + i] : 0.0f;
            }
            __syncthreads();
            for (unsigned int e = tid; e < BM * BN; e += THREADS) {
                const unsigned int r = e / BN, j = e % BN;
                const unsigned int i = q0 + r, key = k0 + j;
                float p = 0.0f, x = 0.0f;
                if (starts[r] != FA_OUTSIDE && key >= starts[r] && key <= i) {
                    p = expf(fa_dot<DMAX>(qs[r], ks[j]) * scale - lse_row[r]);
                    const float dp = fa_dot<DMAX>(gs[r], vs[j]);
                    x = p * (dp - delta_row[r]) * scale;
                }
                ps[r][j] = p;
                ds[r][j] = x;
            }
            __syncthreads();
#pragma unroll 1
            for (int r = 0; r < BM; ++r) {
#pragma unroll
                for (int a = 0; a < ACC; ++a) {
                    const unsigned int e = tid + a * THREADS;
                    const unsigned int j = e / DMAX, c = e % DMAX;
                    dv_acc[a] += ps[r][j] * gs[r][c];
                    dk_acc[a] += ds[r][j] * qs[r][c];
                }
            }
            __syncthreads();
        }
    }

#pragma unroll
    for (int a = 0; a < ACC; ++a) {
        const unsigned int e = tid + a * THREADS;
        const unsigned int j = e / DMAX, c = e % DMAX;
        const unsigned int key = k0 + j;
        if (key >= t || c >= d) continue;
        const unsigned long long at = kv_off + static_cast<unsigned long long>(key) * d + c;
        dk[at] = from_f32<T>(dk_acc[a]);
        dv[at] = from_f32<T>(dv_acc[a]);
    }
}

// ------------------------------------------------------------------------------------------
// Entry points: fa_{fwd,dq,dkdv}_{f32,bf16}_d{64,128}. The d64 kernels serve d <= 64, the
// d128 kernels 64 < d <= 128.

#define FA_ENTRIES(T, NAME, DMAX)                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        fa_fwd_##NAME##_d##DMAX(const T* q, const T* k, const T* v, const unsigned int* seg_off, \
                                const unsigned int* segs, T* out, float* lse,                    \
                                unsigned int heads, unsigned int kv_heads, unsigned int t,       \
                                unsigned int d, float scale, unsigned int q_blocks) {            \
        fa_fwd<T, DMAX>(q, k, v, seg_off, segs, out, lse, heads, kv_heads, t, d, scale,          \
                        q_blocks);                                                               \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        fa_dq_##NAME##_d##DMAX(const T* q, const T* k, const T* v, const T* o, const T* d_o,     \
                               const float* lse, const unsigned int* seg_off,                    \
                               const unsigned int* segs, T* dq, float* delta,                    \
                               unsigned int heads, unsigned int kv_heads, unsigned int t,        \
                               unsigned int d, float scale, unsigned int q_blocks) {             \
        fa_dq<T, DMAX>(q, k, v, o, d_o, lse, seg_off, segs, dq, delta, heads, kv_heads, t, d,    \
                       scale, q_blocks);                                                         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        fa_dkdv_##NAME##_d##DMAX(const T* q, const T* k, const T* v, const T* d_o,               \
                                 const float* lse, const float* delta,                           \
                                 const unsigned int* seg_off, const unsigned int* segs, T* dk,   \
                                 T* dv, unsigned int heads, unsigned int kv_heads,               \
                                 unsigned int t, unsigned int d, float scale,                    \
                                 unsigned int k_blocks) {                                        \
        fa_dkdv<T, DMAX>(q, k, v, d_o, lse, delta, seg_off, segs, dk, dv, heads, kv_heads, t, d, \
                         scale, k_blocks);                                                       \
    }

FA_ENTRIES(float, f32, 64)
FA_ENTRIES(float, f32, 128)
FA_ENTRIES(bf16_bits, bf16, 64)
FA_ENTRIES(bf16_bits, bf16, 128)

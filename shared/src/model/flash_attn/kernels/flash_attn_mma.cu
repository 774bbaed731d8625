// FlashAttention-2 forward and backward on tensor cores, bf16 only: the products of each tile
// run as warp-wide mma.sync.m16n8k16 (bf16 inputs, f32 accumulation), which needs sm_80 or
// newer. Compiled after flash_attn.cu in one NVRTC source (../cuda.rs, with
// --gpu-architecture=compute_80) and reuses its helpers (fa_segment, fa_start, fa_inf,
// from_f32, FA_OUTSIDE, bf16_bits). Same arguments, semantics and outputs as the fa_*_bf16
// kernels, so the launcher only swaps the entry points and the grid (MmaTiles below):
//   fam_fwd_*   per (row, head, block of 64 queries): O and L.
//   fam_dq_*    per (row, head, block of 64 queries): D = rowsum(dO * O) (written) and dQ.
//   fam_dkdv_*  per (row, kv head, block of 64 keys): dK and dV over the group's query heads.
//
// A block is 4 warps (FAM_THREADS = 128, fixed); warp w owns 16 of the block's 64 rows
// (queries in fam_fwd/fam_dq, keys in fam_dkdv) and computes their tile products with mma:
//   fwd:  S = Q K^T, online softmax in registers, O += P V (P rounded to bf16, as in FA2);
//   dq:   S = Q K^T, dP = dO V^T, dS = P (dP - D) scale, dQ += dS K (dS rounded to bf16);
//   dkdv: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q (P, dS rounded to bf16).
// Tiles are staged in shared memory as bf16 with rows padded by 8 elements (16 bytes), so that
// the fragment reads of a warp (8 rows x 4 words, or 4 rows x 8 half-words for the operands
// read transposed) hit 32 distinct banks. Global loads are 16 bytes per thread where d is a
// multiple of 8 and the pointers are 16-byte aligned, else element by element (same values).
// Branches that skip an mma are uniform over the warp (mma.sync needs all 32 lanes).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + c (g = lane / 4, c =
// lane % 4); A (16 x 16, row-major) a0 = (g, 2c..2c+1), a1 = (g + 8, 2c..), a2 = (g, 2c + 8..),
// a3 = (g + 8, 2c + 8..); B (16 x 8, k x n) b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g); C
// (16 x 8, f32) c0, c1 = (g, 2c), (g, 2c + 1), c2, c3 = (g + 8, 2c), (g + 8, 2c + 1). Two
// bf16 per 32-bit register, the lower index in the low half. So the C fragments of two
// adjacent 8-column tiles are, rounded to bf16, the A fragment of their 16 columns.
//
// Under the CPU emulation (tests/cuda_emu/cuda_emu.h) the mma is computed from the 32 lanes'
// fragments exchanged between two warp barriers, with the layouts above.
//
// What would make it faster (not done): ldmatrix for the fragment reads, cp.async double
// buffering of the next tile, exp2 with a folded log2(e) scale, skipping the mask on tiles
// below the diagonal, 128-query blocks of 8 warps, and wgmma/TMA on Hopper.

#define FAM_WARPS 4
#define FAM_THREADS (32 * FAM_WARPS)

// Tile sizes per head-dimension bound (d <= DMAX). FWD_M, DQ_M, DKDV_N: rows per block (16 per
// warp). FWD_N, DQ_N: keys per tile of the key loop; DKDV_M: queries per tile of the query
// loop.
template <int DMAX>
struct MmaTiles;
template <>
struct MmaTiles<64> {
    static constexpr int FWD_M = 64, FWD_N = 64, DQ_M = 64, DQ_N = 32, DKDV_N = 64, DKDV_M = 32;
};
template <>
struct MmaTiles<128> {
    static constexpr int FWD_M = 64, FWD_N = 32, DQ_M = 64, DQ_N = 16, DKDV_N = 64, DKDV_M = 16;
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FAM_MAY_ALIAS
#else
#define FAM_MAY_ALIAS __attribute__((may_alias))
#endif
// 16 bytes: 8 bf16 of a row. Shared tiles are arrays of these (aligned for 16-byte stores) and
// are read as 32-bit words.
struct alignas(16) fam_chunk {
    unsigned int w[4];
} FAM_MAY_ALIAS;

// Chunks per padded tile row of head-dimension bound DMAX (DMAX + 8 bf16).
template <int DMAX>
struct FamRow {
    static constexpr int CHUNKS = DMAX / 8 + 1;
};

// D += A B for one m16n8k16 tile (fragments as in the header).
__device__ __forceinline__ void fam_mma(float (&c)[4], const unsigned int (&a)[4],
                                        unsigned int b0, unsigned int b1) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    cuda_emu::mma_m16n8k16_bf16(c, a, b0, b1);
#endif
}

// Two floats rounded to bf16 and packed, `lo` in the low half.
__device__ __forceinline__ unsigned int fam_pack(float lo, float hi) {
    return static_cast<unsigned int>(from_f32<bf16_bits>(lo)) |
           (static_cast<unsigned int>(from_f32<bf16_bits>(hi)) << 16);
}

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix.x4): lane 8 i + j gives the address of
// row j of matrix i (16 bytes, 16-byte aligned). Without `trans` lane 4 g + c gets elements
// (g, 2c), (g, 2c + 1) of matrix i in r[i]; with `trans`, elements (2c, g), (2c + 1, g).
template <bool TRANS>
__device__ __forceinline__ void fam_ldsm_x4(unsigned int (&r)[4], const fam_chunk* row) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    const unsigned int at = static_cast<unsigned int>(__cvta_generic_to_shared(row));
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
#else
    cuda_emu::ldmatrix_x4(r, row, TRANS);
#endif
}

// A fragment of rows [r0, r0 + 16) and columns [k0, k0 + 16) of a row-major tile: matrices
// (rows +0, cols +0), (rows +8, cols +0), (rows +0, cols +8), (rows +8, cols +8).
template <int C>
__device__ __forceinline__ void fam_frag_a(unsigned int (&a)[4], const fam_chunk (*tile)[C],
                                           unsigned int r0, unsigned int k0, unsigned int lane) {
    const unsigned int i = lane / 8, j = lane % 8;
    fam_ldsm_x4<false>(a, &tile[r0 + j + 8 * (i % 2)][k0 / 8 + i / 2]);
}

// B fragments of two 8-wide n tiles (n in [n0, n0 + 16), k in [k0, k0 + 16)) of a tile stored
// as [n][k] (B^T row-major: keys as n and dims as k for S = Q K^T): b[t] for n tile n0 + 8 t.
template <int C>
__device__ __forceinline__ void fam_frag_b_nk(unsigned int (&b)[2][2],
                                              const fam_chunk (*tile)[C], unsigned int n0,
                                              unsigned int k0, unsigned int lane) {
    const unsigned int i = lane / 8, j = lane % 8;
    unsigned int r[4];
    fam_ldsm_x4<false>(r, &tile[n0 + j + 8 * (i / 2)][k0 / 8 + i % 2]);
    b[0][0] = r[0];
    b[0][1] = r[1];
    b[1][0] = r[2];
    b[1][1] = r[3];
}

// B fragments of two 8-wide n tiles (n in [n0, n0 + 16), k in [k0, k0 + 16)) of a tile stored
// as [k][n] (B row-major: keys as k and dims as n for P V), loaded transposed.
template <int C>
__device__ __forceinline__ void fam_frag_b_kn(unsigned int (&b)[2][2],
                                              const fam_chunk (*tile)[C], unsigned int k0,
                                              unsigned int n0, unsigned int lane) {
    const unsigned int i = lane / 8, j = lane % 8;
    unsigned int r[4];
    fam_ldsm_x4<true>(r, &tile[k0 + j + 8 * (i % 2)][n0 / 8 + i / 2]);
    b[0][0] = r[0];
    b[0][1] = r[1];
    b[1][0] = r[2];
    b[1][1] = r[3];
}

// The A fragment of 16 columns from the C fragments of its two 8-column halves, as bf16.
__device__ __forceinline__ void fam_c_to_a(unsigned int (&a)[4], const float (&lo)[4],
                                           const float (&hi)[4]) {
    a[0] = fam_pack(lo[0], lo[1]);
    a[1] = fam_pack(lo[2], lo[3]);
    a[2] = fam_pack(hi[0], hi[1]);
    a[3] = fam_pack(hi[2], hi[3]);
}

// Rows [row0, row0 + ROWS) of a (t, d) bf16 matrix into `dst` (zero past t and past d).
template <int DMAX, int ROWS>
__device__ __forceinline__ void fam_load(fam_chunk (*dst)[FamRow<DMAX>::CHUNKS],
                                         const bf16_bits* src, unsigned int row0, unsigned int t,
                                         unsigned int d) {
    constexpr unsigned int CH = DMAX / 8;
    const bool vec = d % 8 == 0 && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0;
    for (unsigned int e = threadIdx.x; e < ROWS * CH; e += FAM_THREADS) {
        const unsigned int r = e / CH, ch = e % CH, col0 = 8 * ch;
        const unsigned int i = row0 + r;
        fam_chunk x;
        if (i < t && col0 < d) {
            const bf16_bits* p = src + static_cast<unsigned long long>(i) * d;
            if (vec) {
                x = *reinterpret_cast<const fam_chunk*>(p + col0);
            } else {
#pragma unroll
                for (unsigned int k = 0; k < 4; ++k) {
                    const unsigned int c = col0 + 2 * k;
                    const unsigned int lo = c < d ? static_cast<unsigned int>(p[c]) : 0u;
                    const unsigned int hi = c + 1 < d ? static_cast<unsigned int>(p[c + 1]) : 0u;
                    x.w[k] = lo | (hi << 16);
                }
            }
        } else {
#pragma unroll
            for (unsigned int k = 0; k < 4; ++k) x.w[k] = 0u;
        }
        dst[r][ch] = x;
    }
}

// Per warp, the key range [lo, hi) its 16 rows can see (lo = FA_OUTSIDE, hi = 0 if none) and
// the largest start of its rows (FA_OUTSIDE if a row is outside every segment), and the
// block's range: computed by thread 0 from `starts` (FA_OUTSIDE for rows outside every
// segment). Rows are queries q0 + r.
__device__ __forceinline__ void fam_query_ranges(const unsigned int* starts, unsigned int q0,
                                                 unsigned int (*ranges)[3]) {
    unsigned int blo = FA_OUTSIDE, bhi = 0;
    for (int w = 0; w < FAM_WARPS; ++w) {
        unsigned int lo = FA_OUTSIDE, hi = 0, max_start = 0;
        for (int r = 16 * w; r < 16 * w + 16; ++r) {
            if (starts[r] == FA_OUTSIDE) {
                max_start = FA_OUTSIDE;
                continue;
            }
            if (max_start != FA_OUTSIDE && starts[r] > max_start) max_start = starts[r];
            lo = starts[r] < lo ? starts[r] : lo;
            hi = q0 + r + 1;
        }
        ranges[w][0] = lo;
        ranges[w][1] = hi;
        ranges[w][2] = max_start;
        blo = lo < blo ? lo : blo;
        bhi = hi > bhi ? hi : bhi;
    }
    ranges[FAM_WARPS][0] = blo;
    ranges[FAM_WARPS][1] = bhi;
    ranges[FAM_WARPS][2] = FA_OUTSIDE;
}

// Whether every key of [k0, k0 + n) is visible to every query of [i0, i0 + 16) whose segments
// all start at or before `max_start` (FA_OUTSIDE: some query is outside every segment): then
// the tile needs no mask. Keys at or past t never pass (their queries would be past t).
__device__ __forceinline__ bool fam_all_visible(unsigned int k0, unsigned int n, unsigned int i0,
                                                unsigned int max_start) {
    return max_start != FA_OUTSIDE && k0 >= max_start && k0 + n <= i0 + 1;
}

// ------------------------------------------------------------------------------------------
// Forward.

template <int DMAX>
__device__ __forceinline__ void fam_fwd(const bf16_bits* q, const bf16_bits* k,
                                        const bf16_bits* v, const unsigned int* seg_off,
                                        const unsigned int* segs, bf16_bits* out, float* lse,
                                        unsigned int heads, unsigned int kv_heads,
                                        unsigned int t, unsigned int d, float scale,
                                        unsigned int q_blocks) {
    constexpr int BM = MmaTiles<DMAX>::FWD_M, BN = MmaTiles<DMAX>::FWD_N;
    constexpr int C = FamRow<DMAX>::CHUNKS;
    constexpr int KS = DMAX / 16;  // k-steps over the head dimension
    constexpr int NT = BN / 8;     // 8-key tiles of S
    constexpr int DT = DMAX / 8;   // 8-column tiles of O
    static_assert(BM == 16 * FAM_WARPS, "16 query rows per warp");
    __shared__ fam_chunk qs[BM][C];
    __shared__ fam_chunk ks[BN][C];
    __shared__ fam_chunk vs[BN][C];
    __shared__ unsigned int starts[BM];
    __shared__ unsigned int ranges[FAM_WARPS + 1][3];

    const unsigned int qb = q_blocks - 1 - blockIdx.x % q_blocks;  // heaviest first
    const unsigned int bh = blockIdx.x / q_blocks;
    const unsigned int row = bh / heads, h = bh % heads;
    const unsigned int kvh = row * kv_heads + h / (heads / kv_heads);
    const unsigned int q0 = qb * BM;
    const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
    const unsigned long long kv_off = static_cast<unsigned long long>(kvh) * t * d;
    const unsigned int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    const unsigned int g = lane / 4, c4 = lane % 4;

    for (unsigned int r = tid; r < BM; r += FAM_THREADS) {
        const unsigned int i = q0 + r;
        starts[r] = i < t ? fa_start(seg_off, segs, row, i) : FA_OUTSIDE;
    }
    fam_load<DMAX, BM>(qs, q + head_off, q0, t, d);
    __syncthreads();
    if (tid == 0) fam_query_ranges(starts, q0, ranges);
    __syncthreads();
    const unsigned int lo = ranges[FAM_WARPS][0], hi = ranges[FAM_WARPS][1];
    const unsigned int wlo = ranges[w][0], whi = ranges[w][1], wmax_start = ranges[w][2];

    unsigned int qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; ++s) fam_frag_a(qa[s], qs, 16 * w, 16 * s, lane);
    // This lane's two rows: g and g + 8 of the warp's 16.
    const unsigned int i0 = q0 + 16 * w + g, i1 = i0 + 8;
    const unsigned int st0 = starts[16 * w + g], st1 = starts[16 * w + g + 8];

    float m[2] = {-fa_inf(), -fa_inf()}, l[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (unsigned int k0 = lo; k0 < hi; k0 += BN) {
        fam_load<DMAX, BN>(ks, k + kv_off, k0, t, d);
        fam_load<DMAX, BN>(vs, v + kv_off, k0, t, d);
        __syncthreads();
        if (k0 < whi && k0 + BN > wlo) {
            float s[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    unsigned int b[2][2];
                    fam_frag_b_nk(b, ks, 8 * n, 16 * kk, lane);
                    fam_mma(s[n], qa[kk], b[0][0], b[0][1]);
                    fam_mma(s[n + 1], qa[kk], b[1][0], b[1][1]);
                }
            }
            // Scale and mask (tiles below the diagonal of one segment need no mask); the
            // tile's row maxima.
            const bool full = fam_all_visible(k0, BN, q0 + 16 * w, wmax_start);
            float mx[2] = {-fa_inf(), -fa_inf()};
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned int key = k0 + 8 * n + 2 * c4 + (e & 1);
                    const unsigned int i = e < 2 ? i0 : i1, st = e < 2 ? st0 : st1;
                    const bool visible = full || (st != FA_OUTSIDE && key >= st && key <= i);
                    s[n][e] = visible ? s[n][e] * scale : -fa_inf();
                    mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
                }
            }
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float m_new = fmaxf(m[r], mx[r]);
                // Nothing visible yet: keep m = -inf, l = 0 (exp(-inf - -inf) would be NaN).
                corr[r] = m_new == -fa_inf() ? 1.0f : expf(m[r] - m_new);
                m[r] = m_new;
            }
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float mr = m[e / 2];
                    const float p = mr == -fa_inf() ? 0.0f : expf(s[n][e] - mr);
                    s[n][e] = p;
                    sum[e / 2] += p;
                }
            }
            // Per-lane partial row sums (the lane's columns); summed over the quad at the end.
            l[0] = l[0] * corr[0] + sum[0];
            l[1] = l[1] * corr[1] + sum[1];
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[j][0] *= corr[0];
                o[j][1] *= corr[0];
                o[j][2] *= corr[1];
                o[j][3] *= corr[1];
            }
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                unsigned int pa[4];
                fam_c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int j = 0; j < DT; j += 2) {
                    unsigned int b[2][2];
                    fam_frag_b_kn(b, vs, 16 * kk, 8 * j, lane);
                    fam_mma(o[j], pa, b[0][0], b[0][1]);
                    fam_mma(o[j + 1], pa, b[1][0], b[1][1]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned int i = e < 2 ? i0 : i1, col = 8 * j + 2 * c4 + (e & 1);
            if (i >= t || col >= d) continue;
            const float lr = l[e / 2];
            out[head_off + static_cast<unsigned long long>(i) * d + col] =
                from_f32<bf16_bits>(lr > 0.0f ? o[j][e] / lr : 0.0f);
        }
    }
    if (c4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned int i = r == 0 ? i0 : i1;
            if (i < t)
                lse[static_cast<unsigned long long>(bh) * t + i] =
                    l[r] > 0.0f ? m[r] + logf(l[r]) : fa_inf();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward: dQ (and D).

template <int DMAX>
__device__ __forceinline__ void fam_dq(const bf16_bits* q, const bf16_bits* k,
                                       const bf16_bits* v, const bf16_bits* o,
                                       const bf16_bits* d_o, const float* lse,
                                       const unsigned int* seg_off, const unsigned int* segs,
                                       bf16_bits* dq, float* delta, unsigned int heads,
                                       unsigned int kv_heads, unsigned int t, unsigned int d,
                                       float scale, unsigned int q_blocks) {
    constexpr int BM = MmaTiles<DMAX>::DQ_M, BN = MmaTiles<DMAX>::DQ_N;
    constexpr int C = FamRow<DMAX>::CHUNKS;
    constexpr int KS = DMAX / 16, NT = BN / 8, DT = DMAX / 8;
    static_assert(BM == 16 * FAM_WARPS, "16 query rows per warp");
    __shared__ fam_chunk qs[BM][C];
    __shared__ fam_chunk gs[BM][C];  // dO
    __shared__ fam_chunk ks[BN][C];
    __shared__ fam_chunk vs[BN][C];
    __shared__ unsigned int starts[BM];
    __shared__ float lse_row[BM], delta_row[BM];
    __shared__ unsigned int ranges[FAM_WARPS + 1][3];

    const unsigned int qb = q_blocks - 1 - blockIdx.x % q_blocks;
    const unsigned int bh = blockIdx.x / q_blocks;
    const unsigned int row = bh / heads, h = bh % heads;
    const unsigned int kvh = row * kv_heads + h / (heads / kv_heads);
    const unsigned int q0 = qb * BM;
    const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
    const unsigned long long kv_off = static_cast<unsigned long long>(kvh) * t * d;
    const unsigned int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    const unsigned int g = lane / 4, c4 = lane % 4;

    fam_load<DMAX, BM>(qs, q + head_off, q0, t, d);
    fam_load<DMAX, BM>(gs, d_o + head_off, q0, t, d);
    // D = rowsum(dO * O) in f32 from the inputs (dO as loaded, O from global): warp w sums its
    // 16 rows, a row's columns over the lanes.
    for (unsigned int r = 16 * w; r < 16 * w + 16; ++r) {
        const unsigned int i = q0 + r;
        float dsum = 0.0f;
        if (i < t) {
            const unsigned long long at = head_off + static_cast<unsigned long long>(i) * d;
            for (unsigned int col = lane; col < d; col += 32)
                dsum += to_f32(o[at + col]) * to_f32(d_o[at + col]);
        }
#pragma unroll
        for (int x = 16; x >= 1; x /= 2) dsum += __shfl_xor_sync(0xffffffffu, dsum, x);
        if (lane == 0) {
            delta_row[r] = dsum;
            starts[r] = i < t ? fa_start(seg_off, segs, row, i) : FA_OUTSIDE;
            lse_row[r] = i < t ? lse[static_cast<unsigned long long>(bh) * t + i] : fa_inf();
            if (i < t) delta[static_cast<unsigned long long>(bh) * t + i] = dsum;
        }
    }
    __syncthreads();
    if (tid == 0) fam_query_ranges(starts, q0, ranges);
    __syncthreads();
    const unsigned int lo = ranges[FAM_WARPS][0], hi = ranges[FAM_WARPS][1];
    const unsigned int wlo = ranges[w][0], whi = ranges[w][1], wmax_start = ranges[w][2];

    unsigned int qa[KS][4], ga[KS][4];
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        fam_frag_a(qa[s], qs, 16 * w, 16 * s, lane);
        fam_frag_a(ga[s], gs, 16 * w, 16 * s, lane);
    }
    const unsigned int r0 = 16 * w + g, r1 = r0 + 8;
    const unsigned int i0 = q0 + r0, i1 = q0 + r1;
    const unsigned int st0 = starts[r0], st1 = starts[r1];
    const float l0 = lse_row[r0], l1 = lse_row[r1];
    const float dl0 = delta_row[r0], dl1 = delta_row[r1];

    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    for (unsigned int k0 = lo; k0 < hi; k0 += BN) {
        fam_load<DMAX, BN>(ks, k + kv_off, k0, t, d);
        fam_load<DMAX, BN>(vs, v + kv_off, k0, t, d);
        __syncthreads();
        if (k0 < whi && k0 + BN > wlo) {
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
            }
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    unsigned int b[2][2];
                    fam_frag_b_nk(b, ks, 8 * n, 16 * kk, lane);
                    fam_mma(s[n], qa[kk], b[0][0], b[0][1]);
                    fam_mma(s[n + 1], qa[kk], b[1][0], b[1][1]);
                    fam_frag_b_nk(b, vs, 8 * n, 16 * kk, lane);
                    fam_mma(dp[n], ga[kk], b[0][0], b[0][1]);
                    fam_mma(dp[n + 1], ga[kk], b[1][0], b[1][1]);
                }
            }
            // dS = P (dP - D) scale with P = exp(S scale - L); zero where invisible.
            const bool full = fam_all_visible(k0, BN, q0 + 16 * w, wmax_start);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned int key = k0 + 8 * n + 2 * c4 + (e & 1);
                    const unsigned int i = e < 2 ? i0 : i1, st = e < 2 ? st0 : st1;
                    float x = 0.0f;
                    if (full || (st != FA_OUTSIDE && key >= st && key <= i)) {
                        const float p = expf(s[n][e] * scale - (e < 2 ? l0 : l1));
                        x = p * (dp[n][e] - (e < 2 ? dl0 : dl1)) * scale;
                    }
                    s[n][e] = x;
                }
            }
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                unsigned int da[4];
                fam_c_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int j = 0; j < DT; j += 2) {
                    unsigned int b[2][2];
                    fam_frag_b_kn(b, ks, 16 * kk, 8 * j, lane);
                    fam_mma(acc[j], da, b[0][0], b[0][1]);
                    fam_mma(acc[j + 1], da, b[1][0], b[1][1]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int j = 0; j < DT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned int i = e < 2 ? i0 : i1, col = 8 * j + 2 * c4 + (e & 1);
            if (i >= t || col >= d) continue;
            dq[head_off + static_cast<unsigned long long>(i) * d + col] =
                from_f32<bf16_bits>(acc[j][e]);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward: dK and dV.

template <int DMAX>
__device__ __forceinline__ void fam_dkdv(const bf16_bits* q, const bf16_bits* k,
                                         const bf16_bits* v, const bf16_bits* d_o,
                                         const float* lse, const float* delta,
                                         const unsigned int* seg_off, const unsigned int* segs,
                                         bf16_bits* dk, bf16_bits* dv, unsigned int heads,
                                         unsigned int kv_heads, unsigned int t, unsigned int d,
                                         float scale, unsigned int k_blocks) {
    constexpr int BN = MmaTiles<DMAX>::DKDV_N, BM = MmaTiles<DMAX>::DKDV_M;
    constexpr int C = FamRow<DMAX>::CHUNKS;
    constexpr int KS = DMAX / 16, NT = BM / 8, DT = DMAX / 8;
    static_assert(BN == 16 * FAM_WARPS, "16 key rows per warp");
    __shared__ fam_chunk ks[BN][C];
    __shared__ fam_chunk vs[BN][C];
    __shared__ fam_chunk qs[BM][C];
    __shared__ fam_chunk gs[BM][C];  // dO
    __shared__ unsigned int starts[BM];
    __shared__ float lse_row[BM], delta_row[BM];
    __shared__ unsigned int key_end[BN];
    __shared__ unsigned int q_hi, q_max_start;

    const unsigned int kb = blockIdx.x % k_blocks;  // lowest keys (most queries) first
    const unsigned int bg = blockIdx.x / k_blocks;  // row * kv_heads + kv head
    const unsigned int row = bg / kv_heads;
    const unsigned int rep = heads / kv_heads;
    const unsigned int k0 = kb * BN;
    const unsigned long long kv_off = static_cast<unsigned long long>(bg) * t * d;
    const unsigned int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    const unsigned int g = lane / 4, c4 = lane % 4;

    fam_load<DMAX, BN>(ks, k + kv_off, k0, t, d);
    fam_load<DMAX, BN>(vs, v + kv_off, k0, t, d);
    for (unsigned int r = tid; r < BN; r += FAM_THREADS) {
        const unsigned int j = k0 + r;
        const int s = j < t ? fa_segment(seg_off, segs, row, j) : -1;
        key_end[r] = s < 0 ? 0u : segs[2 * s + 1];
    }
    __syncthreads();
    if (tid == 0) {
        unsigned int e = 0;
        for (int j = 0; j < BN; ++j) e = key_end[j] > e ? key_end[j] : e;
        q_hi = e;  // queries [k0, q_hi) can see a key of this block
    }
    __syncthreads();
    const unsigned int hi = q_hi;
    // This lane's two keys (rows of S^T): g and g + 8 of the warp's 16.
    const unsigned int wk0 = k0 + 16 * w;
    const unsigned int key0 = wk0 + g, key1 = key0 + 8;

    float dk_acc[DT][4], dv_acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.0f;
    }

    for (unsigned int gq = 0; gq < rep; ++gq) {
        const unsigned int bh = bg * rep + gq;  // row * heads + query head
        const unsigned long long head_off = static_cast<unsigned long long>(bh) * t * d;
        for (unsigned int q0 = k0; q0 < hi; q0 += BM) {
            fam_load<DMAX, BM>(qs, q + head_off, q0, t, d);
            fam_load<DMAX, BM>(gs, d_o + head_off, q0, t, d);
            for (unsigned int r = tid; r < BM; r += FAM_THREADS) {
                const unsigned int i = q0 + r;
                const bool in = i < t;
                starts[r] = in ? fa_start(seg_off, segs, row, i) : FA_OUTSIDE;
                lse_row[r] = in ? lse[static_cast<unsigned long long>(bh) * t + i] : fa_inf();
                delta_row[r] = in ? delta[static_cast<unsigned long long>(bh) * t + i] : 0.0f;
            }
            __syncthreads();
            if (tid == 0) {
                unsigned int ms = 0;
                for (int r = 0; r < BM && ms != FA_OUTSIDE; ++r)
                    ms = starts[r] == FA_OUTSIDE || starts[r] > ms ? starts[r] : ms;
                q_max_start = ms;
            }
            __syncthreads();
            // The warp's keys are all after the tile's queries: nothing to add (causal).
            if (q0 + BM > wk0 && wk0 < t) {
                float s[NT][4], dp[NT][4];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
                }
#pragma unroll
                for (int kk = 0; kk < KS; ++kk) {
                    unsigned int ka[4], va[4];
                    fam_frag_a(ka, ks, 16 * w, 16 * kk, lane);
                    fam_frag_a(va, vs, 16 * w, 16 * kk, lane);
#pragma unroll
                    for (int n = 0; n < NT; n += 2) {
                        unsigned int b[2][2];
                        fam_frag_b_nk(b, qs, 8 * n, 16 * kk, lane);
                        fam_mma(s[n], ka, b[0][0], b[0][1]);
                        fam_mma(s[n + 1], ka, b[1][0], b[1][1]);
                        fam_frag_b_nk(b, gs, 8 * n, 16 * kk, lane);
                        fam_mma(dp[n], va, b[0][0], b[0][1]);
                        fam_mma(dp[n + 1], va, b[1][0], b[1][1]);
                    }
                }
                // P^T and dS^T: rows are keys, columns queries. No mask where the warp's 16
                // keys are all visible to all the tile's queries.
                const unsigned int qms = q_max_start;
                const bool full = qms != FA_OUTSIDE && wk0 >= qms && wk0 + 16 <= q0 + 1;
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const unsigned int col = 8 * n + 2 * c4 + (e & 1);
                        const unsigned int i = q0 + col, key = e < 2 ? key0 : key1;
                        const unsigned int st = starts[col];
                        float p = 0.0f, x = 0.0f;
                        if (full || (st != FA_OUTSIDE && key >= st && key <= i)) {
                            p = expf(s[n][e] * scale - lse_row[col]);
                            x = p * (dp[n][e] - delta_row[col]) * scale;
                        }
                        s[n][e] = p;
                        dp[n][e] = x;
                    }
                }
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk) {
                    unsigned int pa[4], da[4];
                    fam_c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
                    fam_c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                    for (int j = 0; j < DT; j += 2) {
                        unsigned int b[2][2];
                        fam_frag_b_kn(b, gs, 16 * kk, 8 * j, lane);
                        fam_mma(dv_acc[j], pa, b[0][0], b[0][1]);
                        fam_mma(dv_acc[j + 1], pa, b[1][0], b[1][1]);
                        fam_frag_b_kn(b, qs, 16 * kk, 8 * j, lane);
                        fam_mma(dk_acc[j], da, b[0][0], b[0][1]);
                        fam_mma(dk_acc[j + 1], da, b[1][0], b[1][1]);
                    }
                }
            }
            __syncthreads();
        }
    }

#pragma unroll
    for (int j = 0; j < DT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned int key = e < 2 ? key0 : key1, col = 8 * j + 2 * c4 + (e & 1);
            if (key >= t || col >= d) continue;
            const unsigned long long at = kv_off + static_cast<unsigned long long>(key) * d + col;
            dk[at] = from_f32<bf16_bits>(dk_acc[j][e]);
            dv[at] = from_f32<bf16_bits>(dv_acc[j][e]);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Entry points: fam_{fwd,dq,dkdv}_bf16_d{64,128}, the arguments of fa_*_bf16_d*.

#define FAM_ENTRIES(DMAX)                                                                       \
    extern "C" __global__ void __launch_bounds__(FAM_THREADS)                                    \
        fam_fwd_bf16_d##DMAX(const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,         \
                             const unsigned int* seg_off, const unsigned int* segs,              \
                             bf16_bits* out, float* lse, unsigned int heads,                     \
                             unsigned int kv_heads, unsigned int t, unsigned int d, float scale, \
                             unsigned int q_blocks) {                                            \
        fam_fwd<DMAX>(q, k, v, seg_off, segs, out, lse, heads, kv_heads, t, d, scale, q_blocks); \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(FAM_THREADS)                                    \
        fam_dq_bf16_d##DMAX(const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,          \
                            const bf16_bits* o, const bf16_bits* d_o, const float* lse,          \
                            const unsigned int* seg_off, const unsigned int* segs,               \
                            bf16_bits* dq, float* delta, unsigned int heads,                     \
                            unsigned int kv_heads, unsigned int t, unsigned int d, float scale,  \
                            unsigned int q_blocks) {                                             \
        fam_dq<DMAX>(q, k, v, o, d_o, lse, seg_off, segs, dq, delta, heads, kv_heads, t, d,      \
                     scale, q_blocks);                                                           \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(FAM_THREADS)                                    \
        fam_dkdv_bf16_d##DMAX(const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,        \
                              const bf16_bits* d_o, const float* lse, const float* delta,        \
                              const unsigned int* seg_off, const unsigned int* segs,             \
                              bf16_bits* dk, bf16_bits* dv, unsigned int heads,                  \
                              unsigned int kv_heads, unsigned int t, unsigned int d,             \
                              float scale, unsigned int k_blocks) {                              \
        fam_dkdv<DMAX>(q, k, v, d_o, lse, delta, seg_off, segs, dk, dv, heads, kv_heads, t, d,   \
                       scale, k_blocks);                                                         \
    }

FAM_ENTRIES(64)
FAM_ENTRIES(128)

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
// Tiles are staged in shared memory as bf16 with rows padded by 8 elements (16 bytes) and read
// into fragments with ldmatrix.x4 (.trans for the operands stored k-major: V in P V, K in dS K,
// dO and Q in the dK/dV products), each 8-row phase of which hits 32 distinct banks. Global
// loads are 16 bytes per thread where d is a multiple of 8 and the pointers are 16-byte
// aligned, else element by element (same values). Branches that skip an mma or ldmatrix are
// uniform over the warp (both need all 32 lanes).
//
// Also here: fam_paged_* (below fam_fwd), the paged prefill of ../../paged, which shares the
// forward's tile step.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + c (g = lane / 4, c =
// lane % 4); A (16 x 16, row-major) a0 = (g, 2c..2c+1), a1 = (g + 8, 2c..), a2 = (g, 2c + 8..),
// a3 = (g + 8, 2c + 8..); B (16 x 8, k x n) b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g); C
// (16 x 8, f32) c0, c1 = (g, 2c), (g, 2c + 1), c2, c3 = (g + 8, 2c), (g + 8, 2c + 1). Two
// bf16 per 32-bit register, the lower index in the low half. So the C fragments of two
// adjacent 8-column tiles are, rounded to bf16, the A fragment of their 16 columns.
//
// Under the CPU emulation (tests/cuda_emu/cuda_emu.h) mma and ldmatrix are computed from the 32
// lanes' fragments or row addresses exchanged between two warp barriers, with these layouts
// (ldmatrix: lane 8 i + j addresses row j of matrix i; lane 4 g + c receives (g, 2c..2c+1) of
// each matrix, or with .trans (2c..2c+1, g)).
//
// Exponentials use the fast __expf (ex2.approx, a few ulp: far below the bf16 rounding of P).
// Tiles that every row of a warp sees whole (below the diagonal of one segment) skip the mask.
//
// What would make it faster (not done): cp.async double buffering of the next tile, 128-query
// blocks of 8 warps with dynamic shared memory, and wgmma/TMA on Hopper.

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

// s[n] += A B_n for the NN 8-wide n tiles of an n-major tile (rows 8 n.., columns [k0, k0 + 16)):
// S = Q K^T with K as the tile, and the like.
template <int NN, int C>
__device__ __forceinline__ void fam_mma_nk(float (*s)[4], const unsigned int (&a)[4],
                                           const fam_chunk (*tile)[C], unsigned int k0,
                                           unsigned int lane) {
#pragma unroll
    for (int n = 0; n < NN; n += 2) {
        unsigned int b[2][2];
        fam_frag_b_nk(b, tile, 8 * n, k0, lane);
        fam_mma(s[n], a, b[0][0], b[0][1]);
        fam_mma(s[n + 1], a, b[1][0], b[1][1]);
    }
}

// acc[j] += A B_j for the NJ 8-wide column tiles of a k-major tile (rows [k0, k0 + 16), read
// transposed): O += P V with V as the tile, and the like.
template <int NJ, int C>
__device__ __forceinline__ void fam_mma_kn(float (*acc)[4], const unsigned int (&a)[4],
                                           const fam_chunk (*tile)[C], unsigned int k0,
                                           unsigned int lane) {
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
        unsigned int b[2][2];
        fam_frag_b_kn(b, tile, k0, 8 * j, lane);
        fam_mma(acc[j], a, b[0][0], b[0][1]);
        fam_mma(acc[j + 1], a, b[1][0], b[1][1]);
    }
}

// ROWS rows of d bf16 into `dst` (zero past d, and for rows whose address is null): row r is
// read at `row_at(r)`. `vec`: every row address is 16-byte aligned and d is a multiple of 8.
template <int DMAX, int ROWS, class RowAt>
__device__ __forceinline__ void fam_load_rows(fam_chunk (*dst)[FamRow<DMAX>::CHUNKS],
                                              RowAt row_at, unsigned int d, bool vec) {
    constexpr unsigned int CH = DMAX / 8;
    for (unsigned int e = threadIdx.x; e < ROWS * CH; e += FAM_THREADS) {
        const unsigned int r = e / CH, ch = e % CH, col0 = 8 * ch;
        const bf16_bits* p = row_at(r);
        fam_chunk x;
        if (p != nullptr && col0 < d) {
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

// Whether 16-byte loads serve rows of d elements at `base` + multiples of `stride` elements.
__device__ __forceinline__ bool fam_vec(const bf16_bits* base, unsigned long long stride,
                                        unsigned int d) {
    return d % 8 == 0 && stride % 8 == 0 &&
           (reinterpret_cast<unsigned long long>(base) & 15ull) == 0;
}

// Rows [row0, row0 + ROWS) of a (t, d) bf16 matrix into `dst` (zero past t and past d).
template <int DMAX, int ROWS>
__device__ __forceinline__ void fam_load(fam_chunk (*dst)[FamRow<DMAX>::CHUNKS],
                                         const bf16_bits* src, unsigned int row0, unsigned int t,
                                         unsigned int d) {
    fam_load_rows<DMAX, ROWS>(
        dst,
        [&](unsigned int r) -> const bf16_bits* {
            const unsigned int i = row0 + r;
            return i < t ? src + static_cast<unsigned long long>(i) * d : nullptr;
        },
        d, fam_vec(src, d, d));
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

// The running state of one warp's 16 query rows: this lane holds rows g and g + 8 (m, and l as
// the partial sum over the lane's columns) and their output columns 8 j + 2 c, + 1.
template <int DMAX>
struct FamFwdState {
    float m[2], l[2];
    float o[DMAX / 8][4];
};

template <int DMAX>
__device__ __forceinline__ void fam_fwd_init(FamFwdState<DMAX>& st) {
    st.m[0] = st.m[1] = -fa_inf();
    st.l[0] = st.l[1] = 0.0f;
#pragma unroll
    for (int j = 0; j < DMAX / 8; ++j) st.o[j][0] = st.o[j][1] = st.o[j][2] = st.o[j][3] = 0.0f;
}

// One key tile of BN keys (first key k0) for the warp's rows: S = Q K^T, scaled, masked where
// !full by visible(r, key) (r = 0 for row g, 1 for row g + 8), online softmax, O += P V.
template <int DMAX, int BN, class Visible>
__device__ __forceinline__ void fam_fwd_tile(FamFwdState<DMAX>& st,
                                             const unsigned int (&qa)[DMAX / 16][4],
                                             const fam_chunk (*ks)[FamRow<DMAX>::CHUNKS],
                                             const fam_chunk (*vs)[FamRow<DMAX>::CHUNKS],
                                             unsigned int k0, bool full, Visible visible,
                                             float scale, unsigned int lane) {
    constexpr int KS = DMAX / 16, NT = BN / 8, DT = DMAX / 8;
    const unsigned int c4 = lane % 4;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) fam_mma_nk<NT>(s, qa[kk], ks, 16 * kk, lane);
    // Scale and mask (tiles that every row sees whole need no mask); the tile's row maxima.
    float mx[2] = {-fa_inf(), -fa_inf()};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const unsigned int key = k0 + 8 * n + 2 * c4 + (e & 1);
            s[n][e] = full || visible(e / 2, key) ? s[n][e] * scale : -fa_inf();
            mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
        }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(st.m[r], mx[r]);
        // Nothing visible yet: keep m = -inf, l = 0 (exp(-inf - -inf) would be NaN).
        corr[r] = m_new == -fa_inf() ? 1.0f : __expf(st.m[r] - m_new);
        st.m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float mr = st.m[e / 2];
            const float p = mr == -fa_inf() ? 0.0f : __expf(s[n][e] - mr);
            s[n][e] = p;
            sum[e / 2] += p;
        }
    }
    st.l[0] = st.l[0] * corr[0] + sum[0];
    st.l[1] = st.l[1] * corr[1] + sum[1];
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        st.o[j][0] *= corr[0];
        st.o[j][1] *= corr[0];
        st.o[j][2] *= corr[1];
        st.o[j][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        unsigned int pa[4];
        fam_c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
        fam_mma_kn<DT>(st.o, pa, vs, 16 * kk, lane);
    }
}

// The quad sums of l (every lane of a row then holds its total).
template <int DMAX>
__device__ __forceinline__ void fam_fwd_finish(FamFwdState<DMAX>& st) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
    }
}

// This lane's C fragments of NJ 8-wide column tiles of two rows (g and g + 8 of its warp's 16),
// divided by div0 / div1, as bf16 into `row0` / `row1` (d elements each; null: not written).
template <int NJ>
__device__ __forceinline__ void fam_store_rows(const float (*acc)[4], bf16_bits* row0,
                                               bf16_bits* row1, float div0, float div1,
                                               unsigned int d, unsigned int lane) {
    const unsigned int c4 = lane % 4;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            bf16_bits* row = e < 2 ? row0 : row1;
            const unsigned int col = 8 * j + 2 * c4 + (e & 1);
            if (row == nullptr || col >= d) continue;
            row[col] = from_f32<bf16_bits>(acc[j][e] / (e < 2 ? div0 : div1));
        }
    }
}

// O = acc / l of this lane's two rows into `row0` / `row1` (null: not written); zero for a row
// that saw nothing (its acc is zero).
template <int DMAX>
__device__ __forceinline__ void fam_fwd_store(const FamFwdState<DMAX>& st, bf16_bits* row0,
                                              bf16_bits* row1, unsigned int d,
                                              unsigned int lane) {
    const float l0 = st.l[0] > 0.0f ? st.l[0] : 1.0f, l1 = st.l[1] > 0.0f ? st.l[1] : 1.0f;
    fam_store_rows<DMAX / 8>(st.o, row0, row1, l0, l1, d, lane);
}

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
    auto visible = [&](unsigned int r, unsigned int key) {
        const unsigned int i = r == 0 ? i0 : i1, st = r == 0 ? st0 : st1;
        return st != FA_OUTSIDE && key >= st && key <= i;
    };

    FamFwdState<DMAX> state;
    fam_fwd_init(state);
    for (unsigned int k0 = lo; k0 < hi; k0 += BN) {
        fam_load<DMAX, BN>(ks, k + kv_off, k0, t, d);
        fam_load<DMAX, BN>(vs, v + kv_off, k0, t, d);
        __syncthreads();
        if (k0 < whi && k0 + BN > wlo) {
            // Tiles below the diagonal of one segment need no mask.
            const bool full = fam_all_visible(k0, BN, q0 + 16 * w, wmax_start);
            fam_fwd_tile<DMAX, BN>(state, qa, ks, vs, k0, full, visible, scale, lane);
        }
        __syncthreads();
    }
    fam_fwd_finish(state);
    bf16_bits* o = out + head_off;
    fam_fwd_store(state, i0 < t ? o + static_cast<unsigned long long>(i0) * d : nullptr,
                  i1 < t ? o + static_cast<unsigned long long>(i1) * d : nullptr, d, lane);
    if (c4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned int i = r == 0 ? i0 : i1;
            const float l = state.l[r];
            if (i < t)
                lse[static_cast<unsigned long long>(bh) * t + i] =
                    l > 0.0f ? state.m[r] + logf(l) : fa_inf();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Paged prefill: the queries of a chunk of one sequence against its paged KV cache (the
// layout of ../../paged: q and out (rows, heads, d); the pools (pool_rows, kv_heads, d); row
// r's token i at pool row blocks[r * width + i / 16] * 16 + i % 16 for i < lens[r]). `tiles`
// holds n_tiles pairs (first row, rows <= 64) of consecutive rows with the same block table
// (checked on the host); a block serves one (tile, query head), grid n_tiles * heads, and its
// rows see keys [0, lens[r]) of the shared table. The forward of fam_fwd otherwise.

#define FAM_PAGE 16

template <int DMAX>
__device__ __forceinline__ void fam_paged(const bf16_bits* q, const bf16_bits* k_pool,
                                          const bf16_bits* v_pool, const unsigned int* blocks,
                                          const unsigned int* lens, const unsigned int* tiles,
                                          bf16_bits* out, unsigned int heads,
                                          unsigned int kv_heads, unsigned int d,
                                          unsigned int width, float scale) {
    constexpr int BM = MmaTiles<DMAX>::FWD_M, BN = MmaTiles<DMAX>::FWD_N;
    constexpr int C = FamRow<DMAX>::CHUNKS;
    constexpr int KS = DMAX / 16;
    static_assert(BM == 16 * FAM_WARPS && BN % FAM_PAGE == 0, "tile shapes");
    __shared__ fam_chunk qs[BM][C];
    __shared__ fam_chunk ks[BN][C];
    __shared__ fam_chunk vs[BN][C];
    __shared__ unsigned int row_len[BM];
    __shared__ unsigned int ranges[FAM_WARPS + 1][2];  // per warp and block: min, max length

    const unsigned int tile = blockIdx.x / heads, h = blockIdx.x % heads;
    const unsigned int row0 = tiles[2 * tile], n_rows = tiles[2 * tile + 1];
    const unsigned int kvh = h / (heads / kv_heads);
    const unsigned int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    const unsigned int g = lane / 4;
    const unsigned long long q_stride = static_cast<unsigned long long>(heads) * d;
    const unsigned long long kv_stride = static_cast<unsigned long long>(kv_heads) * d;
    const unsigned int* table = blocks + static_cast<unsigned long long>(row0) * width;

    for (unsigned int r = tid; r < BM; r += FAM_THREADS)
        row_len[r] = r < n_rows ? lens[row0 + r] : 0u;
    const bf16_bits* q_head = q + static_cast<unsigned long long>(row0) * q_stride +
                              static_cast<unsigned long long>(h) * d;
    fam_load_rows<DMAX, BM>(
        qs,
        [&](unsigned int r) -> const bf16_bits* {
            return r < n_rows ? q_head + r * q_stride : nullptr;
        },
        d, fam_vec(q_head, q_stride, d));
    __syncthreads();
    if (tid == 0) {
        unsigned int bhi = 0;
        for (int ww = 0; ww < FAM_WARPS; ++ww) {
            unsigned int lo = FA_OUTSIDE, hi = 0;
            for (int r = 16 * ww; r < 16 * ww + 16; ++r) {
                lo = row_len[r] < lo ? row_len[r] : lo;
                hi = row_len[r] > hi ? row_len[r] : hi;
            }
            ranges[ww][0] = lo;
            ranges[ww][1] = hi;
            bhi = hi > bhi ? hi : bhi;
        }
        ranges[FAM_WARPS][1] = bhi;
    }
    __syncthreads();
    const unsigned int hi = ranges[FAM_WARPS][1];
    const unsigned int wmin = ranges[w][0], wmax = ranges[w][1];

    unsigned int qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; ++s) fam_frag_a(qa[s], qs, 16 * w, 16 * s, lane);
    const unsigned int len0 = row_len[16 * w + g], len1 = row_len[16 * w + g + 8];
    auto visible = [&](unsigned int r, unsigned int key) { return key < (r == 0 ? len0 : len1); };

    const bool vec = fam_vec(k_pool, kv_stride, d) && fam_vec(v_pool, kv_stride, d);
    FamFwdState<DMAX> state;
    fam_fwd_init(state);
    for (unsigned int k0 = 0; k0 < hi; k0 += BN) {
        // Key j of the tile at its pool row (none at or past the longest row's length).
        auto key_row = [&](const bf16_bits* pool, unsigned int j) -> const bf16_bits* {
            const unsigned int key = k0 + j;
            if (key >= hi) return nullptr;
            const unsigned long long prow =
                static_cast<unsigned long long>(table[key / FAM_PAGE]) * FAM_PAGE +
                key % FAM_PAGE;
            return pool + prow * kv_stride + static_cast<unsigned long long>(kvh) * d;
        };
        fam_load_rows<DMAX, BN>(
            ks, [&](unsigned int j) { return key_row(k_pool, j); }, d, vec);
        fam_load_rows<DMAX, BN>(
            vs, [&](unsigned int j) { return key_row(v_pool, j); }, d, vec);
        __syncthreads();
        if (k0 < wmax) {
            // Every row of the warp sees the whole tile: no mask.
            const bool full = k0 + BN <= wmin;
            fam_fwd_tile<DMAX, BN>(state, qa, ks, vs, k0, full, visible, scale, lane);
        }
        __syncthreads();
    }
    fam_fwd_finish(state);
    const unsigned int r0 = 16 * w + g, r1 = r0 + 8;
    bf16_bits* o_head = out + static_cast<unsigned long long>(row0) * q_stride +
                        static_cast<unsigned long long>(h) * d;
    fam_fwd_store(state, r0 < n_rows ? o_head + r0 * q_stride : nullptr,
                  r1 < n_rows ? o_head + r1 * q_stride : nullptr, d, lane);
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
                fam_mma_nk<NT>(s, qa[kk], ks, 16 * kk, lane);
                fam_mma_nk<NT>(dp, ga[kk], vs, 16 * kk, lane);
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
                        const float p = __expf(s[n][e] * scale - (e < 2 ? l0 : l1));
                        x = p * (dp[n][e] - (e < 2 ? dl0 : dl1)) * scale;
                    }
                    s[n][e] = x;
                }
            }
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                unsigned int da[4];
                fam_c_to_a(da, s[2 * kk], s[2 * kk + 1]);
                fam_mma_kn<DT>(acc, da, ks, 16 * kk, lane);
            }
        }
        __syncthreads();
    }

    bf16_bits* dq_head = dq + head_off;
    fam_store_rows<DT>(acc, i0 < t ? dq_head + static_cast<unsigned long long>(i0) * d : nullptr,
                       i1 < t ? dq_head + static_cast<unsigned long long>(i1) * d : nullptr,
                       1.0f, 1.0f, d, lane);
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
    // Queries [k0, hi) can see a key of this block.
    const unsigned int hi = fa_keys_seen_until(seg_off, segs, row, k0, BN, t, key_end, &q_hi,
                                               FAM_THREADS);
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
                    fam_mma_nk<NT>(s, ka, qs, 16 * kk, lane);
                    fam_mma_nk<NT>(dp, va, gs, 16 * kk, lane);
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
                            p = __expf(s[n][e] * scale - lse_row[col]);
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
                    fam_mma_kn<DT>(dv_acc, pa, gs, 16 * kk, lane);
                    fam_mma_kn<DT>(dk_acc, da, qs, 16 * kk, lane);
                }
            }
            __syncthreads();
        }
    }

    const unsigned long long at0 = kv_off + static_cast<unsigned long long>(key0) * d;
    const unsigned long long at1 = kv_off + static_cast<unsigned long long>(key1) * d;
    fam_store_rows<DT>(dk_acc, key0 < t ? dk + at0 : nullptr, key1 < t ? dk + at1 : nullptr, 1.0f,
                       1.0f, d, lane);
    fam_store_rows<DT>(dv_acc, key0 < t ? dv + at0 : nullptr, key1 < t ? dv + at1 : nullptr, 1.0f,
                       1.0f, d, lane);
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

// fam_paged_bf16_d{64,128}: the paged prefill above.
#define FAM_PAGED_ENTRY(DMAX)                                                                   \
    extern "C" __global__ void __launch_bounds__(FAM_THREADS) fam_paged_bf16_d##DMAX(           \
        const bf16_bits* q, const bf16_bits* k_pool, const bf16_bits* v_pool,                   \
        const unsigned int* blocks, const unsigned int* lens, const unsigned int* tiles,        \
        bf16_bits* out, unsigned int heads, unsigned int kv_heads, unsigned int d,              \
        unsigned int width, float scale) {                                                      \
        fam_paged<DMAX>(q, k_pool, v_pool, blocks, lens, tiles, out, heads, kv_heads, d, width, \
                        scale);                                                                 \
    }

FAM_PAGED_ENTRY(64)
FAM_PAGED_ENTRY(128)

// Paged decode attention for cascade's paged KV cache (../cuda.rs launches it), compiled at run
// time with NVRTC. Same semantics as the CPU kernel (../cpu.rs): q and out (rows, heads, d),
// the pools k and v (pool_rows, kv_heads, d), all contiguous; row r's token i sits at pool row
// blocks[r * width + i / 16] * 16 + i % 16, for i < lens[r]; out[r, h] = softmax(scale *
// q[r, h] . K_r) V_r with kv head g = h / (heads / kv_heads) read in place. Inputs f32 or bf16
// (raw 16-bit words, rounded to nearest even on output like half::bf16::from_f32), arithmetic f32.
//
// Decode is memory-bound: each K/V element serves only the rep = heads / kv_heads queries of its
// group. So one CUDA block serves one (row, kv head, chunk of up to PA_QUERIES = 4 query heads of
// the group) and reads each K/V row of that group once; a group of more than 4 query heads
// (Qwen3-14B: 5, Qwen3-32B: 8) is split over several blocks, each reading the group's K/V (the
// second read mostly from L2: the blocks are adjacent in the grid). q_chunks = ceil(rep /
// PA_QUERIES).
//
// Split-K (flash-decoding): rows * kv_heads * q_chunks blocks can be too few for the GPU (16
// rows x 8 kv heads = 128 blocks for 132 SMs that each hold 4), so the launcher (../cuda.rs,
// choosing with split_plan of ../kernels.rs) may also split each row's cache blocks into
// `splits` ranges of `split_blocks` cache blocks, one CUDA block each:
//   - splits == 1: 1-D grid of rows * kv_heads * q_chunks blocks (chunk fastest), each covering
//     its row whole and writing out (the path without splitting);
//   - splits > 1: pass 1, grid rows * kv_heads * splits * q_chunks (chunk fastest, then split),
//     block s covering cache blocks [s * split_blocks, (s + 1) * split_blocks) of its row (none
//     past the row's end), writes its unnormalised state per query head into the f32 workspace
//     `part`: record (row * heads + head) * splits + s of d + 2 floats, (m, l, acc[0..d]) (m =
//     -inf, l = 0, acc = 0 for a split without tokens). Pass 2 (paged_combine_*, grid rows *
//     heads, a thread per column) combines a (row, head)'s records in split order, as step 7
//     below combines warps, and writes out (deterministic: no atomics, fixed orders). The result
//     equals the unsplit one up to f32 rounding (the rescaling is done in two levels).
//
// Inside a block (THREADS threads = PA_WARPS warps; block barriers only at the start and end):
//   - the block's queries, pre-scaled, go to shared memory as f32 (read back as 16-byte chunks);
//   - warp w walks the block's cache blocks (of its row, or of its split) b_begin + w,
//     b_begin + w + PA_WARPS, ... (16 tokens each) with its own online-softmax state;
//   - per cache block, a warp step covers TPS tokens: each lane reads one 16-byte chunk of one
//     token's row, LPT = DMAX * sizeof(T) / 16 lanes per row (TPS = 1, 2 or 4), so a step is
//     one coalesced 512-byte read at d = DMAX; the cache block's K loads are all issued first,
//     its V loads right after the scores (in flight during the softmax);
//   - scores: per (token, query) a partial dot product per lane (fmaf), summed over the token's
//     LPT lanes with xor shuffles, written to the warp's slice of shared memory;
//   - online softmax: PA_QUERIES * 16 scores over 32 lanes (LPQ lanes per query), max and sum
//     with xor shuffles; p and the rescale factor go back to shared memory;
//   - values: acc = acc * corr + sum_j p_j V_j per lane (its column chunk, its tokens; fmaf);
//   - at the end each warp sums its acc over the lanes sharing columns, then the block combines
//     the warps' (m, l, acc) in shared memory: m = max m_w, o = sum_w acc_w e^(m_w - m) /
//     sum_w l_w e^(m_w - m), in warp order (deterministic: no atomics, fixed orders), and
//     writes out, or with splits > 1 the records (m, l = sum_w l_w e^(m_w - m), acc = sum_w
//     acc_w e^(m_w - m)).
// Head dims: a 64-column layout for d <= 64 and a 128-column one for d <= 128, separate entry
// points so that each gets the registers of its own layout (at most 128 at 128 threads: ptxas
// 13.0 reports 101-128 and no spills for sm_90, so four blocks, 16 warps, fit an SM; the d128
// kernels are at the edge: the split index is read from blockIdx again after the main loop, see
// pa_block_index, else f32 d128 spills a few bytes, as it does for sm_80; the combine kernels
// use 43). Chunks are read with one 16-byte load when d is a multiple of the chunk and k/v are
// 16-byte aligned, else element by element (same values).
//
// What would make it faster (not done): double-buffering the next cache block's K/V (cp.async /
// TMA), exp2 with a folded log2(e) scale, and tensor-core MMA for groups of 8 or more query heads.

#ifndef THREADS
#define THREADS 128
#endif

#define PA_WARPS (THREADS / 32)
// Tokens per cache block (BLOCK_TOKENS of ../mod.rs).
#define PA_BLOCK_TOKENS 16
// Query heads per CUDA block (of one kv head's group).
#define PA_QUERIES 4
// The largest head dimension (MAX_HEAD_DIM of ../kernels.rs).
#define PA_MAX_HEAD_DIM 128
// Blocks per SM the launch bound asks registers for (4 at 128 threads: at most 128 registers).
#define PA_MIN_BLOCKS (512 / THREADS)

static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 256,
              "THREADS must be a multiple of 32 in 32..=256");

typedef unsigned short bf16_bits;

// 16 bytes of one row (4 floats or 8 bf16 words). In the CPU emulation it is read through
// pointers to the element type, so it may alias them.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define PA_MAY_ALIAS
#else
#define PA_MAY_ALIAS __attribute__((may_alias))
#endif
struct alignas(16) pa_chunk {
    unsigned int w[4];
} PA_MAY_ALIAS;

__device__ __forceinline__ float pa_inf() { return __int_as_float(0x7f800000); }

// blockIdx.x, read again where called: an inline-asm read, which the compiler does not merge
// with the blockIdx.x read at the kernel's start, so that what is derived from it need not stay
// in a register through the main loop. Not `asm volatile`: that would count as a possible memory
// write and cost the K/V loads their read-only (ld.global.nc) path.
__device__ __forceinline__ unsigned int pa_block_index() {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    unsigned int i;
    asm("mov.u32 %0, %%ctaid.x;" : "=r"(i));
    return i;
#else
    return blockIdx.x;
#endif
}

__device__ __forceinline__ unsigned int pa_min(unsigned int a, unsigned int b) {
    return a < b ? a : b;
}

// Element types: elements per 16-byte chunk, element e of a chunk as f32, a chunk gathered
// element by element (columns at or past `d` are zero), and f32 to the element type.
template <class T>
struct PaElem;

template <>
struct PaElem<float> {
    static constexpr unsigned int VEC = 4;
    __device__ static __forceinline__ float get(const pa_chunk& c, unsigned int e) {
        return __int_as_float(static_cast<int>(c.w[e]));
    }
    __device__ static __forceinline__ pa_chunk gather(const float* p, unsigned int col0,
                                                      unsigned int d) {
        pa_chunk c;
#pragma unroll
        for (unsigned int e = 0; e < VEC; ++e)
            c.w[e] = col0 + e < d ? __float_as_uint(p[col0 + e]) : 0u;
        return c;
    }
    __device__ static __forceinline__ float from_f32(float x) { return x; }
};

template <>
struct PaElem<bf16_bits> {
    static constexpr unsigned int VEC = 8;
    __device__ static __forceinline__ float get(const pa_chunk& c, unsigned int e) {
        const unsigned int w = c.w[e / 2];
        return __int_as_float(static_cast<int>(e % 2 == 0 ? w << 16 : w & 0xffff0000u));
    }
    __device__ static __forceinline__ pa_chunk gather(const bf16_bits* p, unsigned int col0,
                                                      unsigned int d) {
        pa_chunk c;
#pragma unroll
        for (unsigned int i = 0; i < 4; ++i) {
            const unsigned int e = col0 + 2 * i;
            const unsigned int lo = e < d ? static_cast<unsigned int>(p[e]) : 0u;
            const unsigned int hi = e + 1 < d ? static_cast<unsigned int>(p[e + 1]) : 0u;
            c.w[i] = lo | (hi << 16);
        }
        return c;
    }
    // Round to nearest even, as `half::bf16::from_f32` (NaN stays a quiet NaN).
    __device__ static __forceinline__ bf16_bits from_f32(float x) {
        unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x0040u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return static_cast<bf16_bits>(u >> 16);
    }
};

__device__ __forceinline__ float pa_to_f32(float x) { return x; }
__device__ __forceinline__ float pa_to_f32(bf16_bits x) {
    return __int_as_float(static_cast<int>(static_cast<unsigned int>(x) << 16));
}

// Columns [col0, col0 + VEC) of the row at `p` (zero past d), one 16-byte load when `vec`.
template <class T>
__device__ __forceinline__ pa_chunk pa_load(const T* __restrict__ p, unsigned int col0,
                                            unsigned int d, bool vec) {
    if (vec) {
        if (col0 < d) return *reinterpret_cast<const pa_chunk*>(p + col0);
        pa_chunk z;
#pragma unroll
        for (unsigned int i = 0; i < 4; ++i) z.w[i] = 0u;
        return z;
    }
    return PaElem<T>::gather(p, col0, d);
}

// The block's shared memory (declared by the entry points, sized for the largest variant).
struct PaShared {
    pa_chunk (*q)[PA_MAX_HEAD_DIM / 4];         // the block's queries, pre-scaled, f32 bits
    float (*p)[PA_QUERIES][PA_BLOCK_TOKENS];    // per warp: scores, then probabilities
    float (*corr)[PA_QUERIES];                  // per warp: this cache block's rescale factors
    float (*acc)[PA_QUERIES][PA_MAX_HEAD_DIM];  // per warp: unnormalised outputs
    float (*m)[PA_QUERIES];                     // per warp: running max
    float (*l)[PA_QUERIES];                     // per warp: running sum
};

template <class T, unsigned int DMAX>
__device__ __forceinline__ void pa_decode(const T* __restrict__ q, const T* __restrict__ k,
                                          const T* __restrict__ v,
                                          const unsigned int* __restrict__ blocks,
                                          const unsigned int* __restrict__ lens,
                                          T* __restrict__ out, float* __restrict__ part,
                                          unsigned int heads, unsigned int kv_heads,
                                          unsigned int d, unsigned int width,
                                          unsigned int q_chunks, unsigned int splits,
                                          unsigned int split_blocks, float scale, PaShared sh) {
    constexpr unsigned int BT = PA_BLOCK_TOKENS, QN = PA_QUERIES;
    constexpr unsigned int VEC = PaElem<T>::VEC;
    constexpr unsigned int LPT = DMAX / VEC;  // lanes per token row
    constexpr unsigned int TPS = 32 / LPT;    // tokens per warp step
    constexpr unsigned int STEPS = BT / TPS;  // warp steps per cache block
    constexpr unsigned int LPQ = 32 / QN;     // softmax lanes per query
    constexpr unsigned int TPL = BT / LPQ;    // softmax tokens per lane
    static_assert(LPT >= 1 && LPT <= 32 && 32 % LPT == 0 && BT % TPS == 0, "row layout");
    static_assert(32 % QN == 0 && BT % LPQ == 0, "softmax layout");
    static_assert(DMAX <= PA_MAX_HEAD_DIM, "head dim");

    const unsigned int chunk = blockIdx.x % q_chunks;
    const unsigned int split = blockIdx.x / q_chunks % splits;
    const unsigned int group = blockIdx.x / q_chunks / splits;
    const unsigned int row = group / kv_heads, g = group % kv_heads;
    const unsigned int rep = heads / kv_heads;
    const unsigned int h0 = g * rep + chunk * QN;  // first query head of the block
    const unsigned int nq = pa_min(QN, rep - chunk * QN);
    const unsigned int len = lens[row];
    const unsigned int n_blocks = (len + BT - 1) / BT;
    // The block's cache blocks [b_begin, b_end): the row's all when splits == 1, else split
    // `split` of split_blocks cache blocks (empty past the row's end).
    const unsigned int b_begin = splits == 1 ? 0u : pa_min(n_blocks, split * split_blocks);
    const unsigned int b_end = splits == 1 ? n_blocks : pa_min(n_blocks, b_begin + split_blocks);
    const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int sub = lane / LPT;           // token of a warp step
    const unsigned int col0 = (lane % LPT) * VEC;  // first column of the lane's chunk
    const unsigned int hq = lane / LPQ;            // softmax: query of the lane
    const unsigned int j0 = (lane % LPQ) * TPL;    // softmax: first token of the lane
    const bool vec = d % VEC == 0 &&
                     ((reinterpret_cast<unsigned long long>(k) |
                       reinterpret_cast<unsigned long long>(v)) & 15ull) == 0;
    const unsigned long long pool_stride = static_cast<unsigned long long>(kv_heads) * d;
    const unsigned long long head_off = static_cast<unsigned long long>(g) * d;
    const unsigned int* table = blocks + static_cast<unsigned long long>(row) * width;

    // The block's queries, pre-scaled, as f32 in shared memory (zero past d and past nq).
    for (unsigned int e = threadIdx.x; e < QN * PA_MAX_HEAD_DIM; e += THREADS) {
        const unsigned int h = e / PA_MAX_HEAD_DIM, c = e % PA_MAX_HEAD_DIM;
        const unsigned long long at = (static_cast<unsigned long long>(row) * heads + h0 + h) * d;
        const float x = h < nq && c < d ? pa_to_f32(q[at + c]) * scale : 0.0f;
        sh.q[h][c / 4].w[c % 4] = __float_as_uint(x);
    }
    __syncthreads();
    float acc[QN][VEC];
#pragma unroll
    for (unsigned int h = 0; h < QN; ++h)
#pragma unroll
        for (unsigned int e = 0; e < VEC; ++e) acc[h][e] = 0.0f;
    float m_run = -pa_inf(), l_run = 0.0f;  // of query hq

#pragma unroll 1
    for (unsigned int b = b_begin + warp; b < b_end; b += PA_WARPS) {
        const unsigned int n = pa_min(BT, len - b * BT);
        const unsigned long long base = static_cast<unsigned long long>(table[b]) * BT;
        // 1. The lane's K chunks of this cache block.
        pa_chunk kc[STEPS];
#pragma unroll
        for (unsigned int s = 0; s < STEPS; ++s) {
            const unsigned int tok = s * TPS + sub;
            if (tok < n) {
                kc[s] = pa_load<T>(k + (base + tok) * pool_stride + head_off, col0, d, vec);
            } else {
#pragma unroll
                for (unsigned int i = 0; i < 4; ++i) kc[s].w[i] = 0u;
            }
        }
        // 2. Scores (q is pre-scaled), summed over the LPT lanes of each token row.
#pragma unroll
        for (unsigned int s = 0; s < STEPS; ++s) {
#pragma unroll
            for (unsigned int h = 0; h < QN; ++h) {
                if (h >= nq) break;
                float part = 0.0f;
#pragma unroll
                for (unsigned int i = 0; i < VEC / 4; ++i) {
                    const pa_chunk qc = sh.q[h][col0 / 4 + i];
#pragma unroll
                    for (unsigned int e = 0; e < 4; ++e)
                        part = fmaf(__int_as_float(static_cast<int>(qc.w[e])),
                                    PaElem<T>::get(kc[s], 4 * i + e), part);
                }
#pragma unroll
                for (unsigned int mask = 1; mask < LPT; mask <<= 1)
                    part += __shfl_xor_sync(0xffffffffu, part, mask);
                if (lane % LPT == 0) sh.p[warp][h][s * TPS + sub] = part;
            }
        }
        __syncwarp();
        // 3. The V chunks, loading while the softmax runs.
        pa_chunk vc[STEPS];
#pragma unroll
        for (unsigned int s = 0; s < STEPS; ++s) {
            const unsigned int tok = s * TPS + sub;
            if (tok < n) {
                vc[s] = pa_load<T>(v + (base + tok) * pool_stride + head_off, col0, d, vec);
            } else {
#pragma unroll
                for (unsigned int i = 0; i < 4; ++i) vc[s].w[i] = 0u;
            }
        }
        // 4. Online softmax: lane (hq, tokens j0 .. j0 + TPL).
        float sv[TPL];
        float mx = -pa_inf();
#pragma unroll
        for (unsigned int t = 0; t < TPL; ++t) {
            const unsigned int j = j0 + t;
            sv[t] = hq < nq && j < n ? sh.p[warp][hq][j] : -pa_inf();
            mx = fmaxf(mx, sv[t]);
        }
#pragma unroll
        for (unsigned int mask = 1; mask < LPQ; mask <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, mask));
        const float m_new = fmaxf(m_run, mx);
        float sum = 0.0f;
#pragma unroll
        for (unsigned int t = 0; t < TPL; ++t) {
            const float p = sv[t] == -pa_inf() ? 0.0f : expf(sv[t] - m_new);
            sum += p;
            if (hq < nq) sh.p[warp][hq][j0 + t] = p;
        }
#pragma unroll
        for (unsigned int mask = 1; mask < LPQ; mask <<= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, mask);
        const float corr = m_run == -pa_inf() ? 0.0f : expf(m_run - m_new);
        l_run = l_run * corr + sum;
        m_run = m_new;
        if (lane % LPQ == 0 && hq < nq) sh.corr[warp][hq] = corr;
        __syncwarp();
        // 5. acc = acc * corr + P V over the lane's tokens and columns.
#pragma unroll
        for (unsigned int h = 0; h < QN; ++h) {
            if (h >= nq) break;
            const float c = sh.corr[warp][h];
#pragma unroll
            for (unsigned int e = 0; e < VEC; ++e) acc[h][e] *= c;
        }
#pragma unroll
        for (unsigned int s = 0; s < STEPS; ++s) {
            const unsigned int tok = s * TPS + sub;
            if (tok >= n) continue;
#pragma unroll
            for (unsigned int h = 0; h < QN; ++h) {
                if (h >= nq) break;
                const float p = sh.p[warp][h][tok];
#pragma unroll
                for (unsigned int e = 0; e < VEC; ++e)
                    acc[h][e] = fmaf(p, PaElem<T>::get(vc[s], e), acc[h][e]);
            }
        }
        __syncwarp();  // sh.p is rewritten by the next cache block
    }

    // 6. The warp's state into shared memory: acc summed over the lanes of the same columns.
#pragma unroll
    for (unsigned int h = 0; h < QN; ++h) {
        if (h >= nq) break;
#pragma unroll
        for (unsigned int e = 0; e < VEC; ++e) {
#pragma unroll
            for (unsigned int mask = LPT; mask < 32; mask <<= 1)
                acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], mask);
            if (sub == 0) sh.acc[warp][h][col0 + e] = acc[h][e];
        }
    }
    if (lane % LPQ == 0 && hq < nq) {
        sh.m[warp][hq] = m_run;
        sh.l[warp][hq] = l_run;
    }
    __syncthreads();

    // 7. Combine the warps, in warp order; the output, or with splits > 1 the split's partial
    //    record (m, l, acc[d]) of each query head.
    for (unsigned int e = threadIdx.x; e < nq * d; e += THREADS) {
        const unsigned int h = e / d, c = e % d;
        float m = -pa_inf();
#pragma unroll
        for (unsigned int w = 0; w < PA_WARPS; ++w) m = fmaxf(m, sh.m[w][h]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (unsigned int w = 0; w < PA_WARPS; ++w) {
            const float mw = sh.m[w][h];
            if (mw == -pa_inf()) continue;  // a warp without tokens
            const float wt = expf(mw - m);
            l += sh.l[w][h] * wt;
            o += sh.acc[w][h][c] * wt;
        }
        const unsigned long long at = static_cast<unsigned long long>(row) * heads + h0 + h;
        if (splits == 1) {
            out[at * d + c] = PaElem<T>::from_f32(l > 0.0f ? o * (1.0f / l) : 0.0f);
        } else {
            // The split, from blockIdx again: not kept in a register through the main loop.
            const unsigned int sp = pa_block_index() / q_chunks % splits;
            float* rec = part + (at * splits + sp) * (d + 2);
            if (c == 0) {
                rec[0] = m;  // -inf for a split without tokens (then l = 0, acc = 0)
                rec[1] = l;
            }
            rec[2 + c] = o;
        }
    }
}

// Pass 2 of a split call: out[r, h] from the splits' records part[(r * heads + h) * splits + s]
// = (m, l, acc[d]): m = max_s m_s, out = sum_s acc_s e^(m_s - m) / sum_s l_s e^(m_s - m), in
// split order (deterministic), as step 7 combines warps. One block per (row, head), one thread
// per column.
template <class T>
__device__ __forceinline__ void pa_combine(const float* __restrict__ part, T* __restrict__ out,
                                           unsigned int d, unsigned int splits) {
    const unsigned long long stride = d + 2;
    const float* rec = part + static_cast<unsigned long long>(blockIdx.x) * splits * stride;
    for (unsigned int c = threadIdx.x; c < d; c += THREADS) {
        float m = -pa_inf();
        for (unsigned int s = 0; s < splits; ++s) m = fmaxf(m, rec[s * stride]);
        float l = 0.0f, o = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) {
            const float ms = rec[s * stride];
            if (ms == -pa_inf()) continue;  // a split without tokens
            const float wt = expf(ms - m);
            l += rec[s * stride + 1] * wt;
            o += rec[s * stride + 2 + c] * wt;
        }
        out[static_cast<unsigned long long>(blockIdx.x) * d + c] =
            PaElem<T>::from_f32(l > 0.0f ? o * (1.0f / l) : 0.0f);
    }
}

// ------------------------------------------------------------------------------------------
// Entry points, THREADS threads per block:
//   paged_decode_{f32,bf16}_d{64,128}(q, k_pool, v_pool, blocks, lens, out, part, heads,
//     kv_heads, d, width, q_chunks, splits, split_blocks, scale), grid rows * kv_heads * splits *
//     q_chunks (chunk fastest, then split); with splits == 1 it writes out (part unused, may be
//     null) and covers each row whole, else it writes part, rows * heads * splits records of
//     d + 2 floats, split s covering cache blocks [s * split_blocks, (s + 1) * split_blocks).
//     The d64 kernels serve d <= 64, the d128 kernels 64 < d <= 128 (separate entry points, so
//     that each gets the registers of its own layout: at most 128 at the default 128 threads,
//     i.e. four blocks per SM).
//   paged_combine_{f32,bf16}(part, out, d, splits), grid rows * heads: pass 2 of a split call.

#define PA_ENTRY(T, NAME, DMAX)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, PA_MIN_BLOCKS)                         \
        paged_decode_##NAME##_d##DMAX(const T* q, const T* k, const T* v,                        \
                                      const unsigned int* blocks, const unsigned int* lens,      \
                                      T* out, float* part, unsigned int heads,                   \
                                      unsigned int kv_heads, unsigned int d, unsigned int width, \
                                      unsigned int q_chunks, unsigned int splits,                \
                                      unsigned int split_blocks, float scale) {                  \
        __shared__ pa_chunk pa_q[PA_QUERIES][PA_MAX_HEAD_DIM / 4];                               \
        __shared__ float pa_p[PA_WARPS][PA_QUERIES][PA_BLOCK_TOKENS];                            \
        __shared__ float pa_corr[PA_WARPS][PA_QUERIES];                                          \
        __shared__ float pa_acc[PA_WARPS][PA_QUERIES][PA_MAX_HEAD_DIM];                          \
        __shared__ float pa_m[PA_WARPS][PA_QUERIES];                                             \
        __shared__ float pa_l[PA_WARPS][PA_QUERIES];                                             \
        const PaShared sh{pa_q, pa_p, pa_corr, pa_acc, pa_m, pa_l};                              \
        pa_decode<T, DMAX>(q, k, v, blocks, lens, out, part, heads, kv_heads, d, width,          \
                           q_chunks, splits, split_blocks, scale, sh);                           \
    }

PA_ENTRY(float, f32, 64)
PA_ENTRY(float, f32, 128)
PA_ENTRY(bf16_bits, bf16, 64)
PA_ENTRY(bf16_bits, bf16, 128)

#define PA_COMBINE(T, NAME)                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS, PA_MIN_BLOCKS)                        \
        paged_combine_##NAME(const float* part, T* out, unsigned int d, unsigned int splits) { \
        pa_combine<T>(part, out, d, splits);                                                    \
    }

PA_COMBINE(float, f32)
PA_COMBINE(bf16_bits, bf16)

// Token sampler kernels: one thread block per row of logits. Compiled at run time with NVRTC
// (cudarc) with --fmad=false, so every float operation below rounds exactly like the CPU
// reference in actor/src/sampler/{weights,philox,select,cpu}.rs and picks the same token.
//
// Per row: (1) online max + log-sum-exp of logits / T (behaviour log-prob normaliser);
// (2) top-k then top-p thresholds by MSB-first radix select over the logits' order keys, with
// shared-memory histograms of exact integer counts and masses (integer atomics: the order of
// additions does not matter); (3) Philox4x32-10 uniform, inverse-CDF draw over the kept tokens
// in index order with an exact block-wide integer prefix sum; (4) the sampled token's log-prob.

// Threads per block (the CUDA sampler launches THREADS; the CPU emulation test also builds the
// kernel with a smaller block to run every recorded draw quickly).
#ifndef THREADS
#define THREADS 1024
#endif
#define WARPS (THREADS / 32)
#define BINS 256
#define ITEMS 8
#define BAD_TOKEN 0xffffffffu
// NVRTC has no <math.h>, hence no INFINITY.
#define POS_INF __int_as_float(0x7f800000)
#define NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------- numerics (weights.rs) ----

__device__ __forceinline__ float exp_neg(float d) {
    const float LOG2E = __int_as_float(0x3fb8aa3b);
    const float MAGIC = __int_as_float(0x4b400000);
    const float LN2_HI = __int_as_float(0x3f318000);
    const float LN2_LO = __int_as_float(0xb95e8083);
    float x = fmaxf(d, -87.0f);
    float t = x * LOG2E + MAGIC;
    float n = t - MAGIC;
    int n_int = __float_as_int(t) - 0x4b400000;
    float r = (x - n * LN2_HI) - n * LN2_LO;
    float p = __int_as_float(0x39506967);
    p = p * r + __int_as_float(0x3ab743ce);
    p = p * r + __int_as_float(0x3c088908);
    p = p * r + __int_as_float(0x3d2aa9c1);
    p = p * r + __int_as_float(0x3e2aaaaa);
    p = p * r + __int_as_float(0x3f000000);
    float y = p * (r * r) + r + 1.0f;
    return y * __int_as_float((n_int + 127) << 23);
}

__device__ __forceinline__ unsigned long long quantize(float w) {
    return (unsigned long long)(w * __int_as_float(0x54800000));  // trunc(w * 2^42)
}

__device__ __forceinline__ unsigned int order_key(float logit) {
    unsigned int bits = __float_as_uint(logit + 0.0f);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ unsigned long long scale_uniform(unsigned int bits,
                                                            unsigned long long total) {
    unsigned long long hi = total >> 32, lo = total & 0xffffffffull;
    return (unsigned long long)bits * hi + (((unsigned long long)bits * lo) >> 32);
}

__device__ __forceinline__ unsigned long long top_p_target(float p, unsigned long long total) {
    unsigned long long t = (unsigned long long)ceil((double)p * (double)total);
    unsigned long long hi = total > 0 ? total : 1;
    return t < 1 ? 1 : (t > hi ? hi : t);
}

// ------------------------------------------------------------------ philox (philox.rs) ----

__device__ __forceinline__ unsigned int philox_word0(unsigned long long seed,
                                                     unsigned long long stream,
                                                     unsigned long long position) {
    unsigned int c0 = (unsigned int)position, c1 = (unsigned int)(position >> 32);
    unsigned int c2 = (unsigned int)stream, c3 = (unsigned int)(stream >> 32);
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return c0;
}

// Philox4x32-10 on a batch of counters, for the known-answer test of the device code (launched
// with blocks of 1024 threads, as cudarc's LaunchConfig::for_num_elems does).
extern "C" __global__ void __launch_bounds__(1024) philox_kat(const unsigned int* ctr_key, unsigned int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned int* c = ctr_key + 6 * i;
    unsigned long long position = c[0] | ((unsigned long long)c[1] << 32);
    unsigned long long stream = c[2] | ((unsigned long long)c[3] << 32);
    unsigned long long seed = c[4] | ((unsigned long long)c[5] << 32);
    out[i] = philox_word0(seed, stream, position);
}

// ------------------------------------------------------------------ block reductions ----

struct Shared {
    unsigned int count[BINS];
    unsigned long long mass[BINS];
    double dsum[WARPS];
    float fmax[WARPS];
    unsigned long long usum[WARPS];
    unsigned int umin[WARPS];
    // Radix state, written by thread 0.
    unsigned int prefix;
    unsigned int found;
    unsigned long long above_count, above_mass;
    unsigned long long kept_count, kept_mass;
    unsigned int token;
};

__device__ float block_max(float v, Shared& sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh.fmax[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = sh.fmax[0];
    for (int w = 1; w < WARPS; ++w) r = fmaxf(r, sh.fmax[w]);
    __syncthreads();
    return r;
}

__device__ double block_sum_d(double v, Shared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh.dsum[threadIdx.x >> 5] = v;
    __syncthreads();
    double r = 0.0;
    for (int w = 0; w < WARPS; ++w) r += sh.dsum[w];
    __syncthreads();
    return r;
}

__device__ unsigned long long block_sum_u64(unsigned long long v, Shared& sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh.usum[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long r = 0;
    for (int w = 0; w < WARPS; ++w) r += sh.usum[w];
    __syncthreads();
    return r;
}

__device__ unsigned int block_min_u32(unsigned int v, Shared& sh) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh.umin[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned int r = sh.umin[0];
    for (int w = 1; w < WARPS; ++w) r = min(r, sh.umin[w]);
    __syncthreads();
    return r;
}

// Exclusive prefix sum over the block (thread order), and the block total.
__device__ unsigned long long block_exclusive_scan(unsigned long long v, Shared& sh,
                                                   unsigned long long* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    if (lane == 31) sh.usum[warp] = incl;
    __syncthreads();
    unsigned long long before = 0, all = 0;
    for (int w = 0; w < WARPS; ++w) {
        if (w < warp) before += sh.usum[w];
        all += sh.usum[w];
    }
    __syncthreads();
    *total = all;
    return before + incl - v;
}

// ------------------------------------------------------------------ radix select (select.rs) --

// Largest key v >= min_key with F(v) >= target, F(v) = sum over tokens with key >= v of 1
// (by_mass == 0) or of the integer weight. Sets sh.prefix, sh.kept_count, sh.kept_mass.
__device__ void threshold(const float* row, unsigned int vocab, float max_logit, float inv_t,
                          int by_mass, unsigned long long target, unsigned int min_key,
                          Shared& sh) {
    __syncthreads();  // the caller may still be reading sh.prefix / sh.kept_mass of a previous call
    if (threadIdx.x == 0) { sh.prefix = 0; sh.above_count = 0; sh.above_mass = 0; sh.found = 1; }
    for (int level = 0; level < 4; ++level) {
        int shift = 24 - 8 * level;
        for (int b = threadIdx.x; b < BINS; b += THREADS) { sh.count[b] = 0; sh.mass[b] = 0; }
        __syncthreads();
        unsigned int prefix = sh.prefix;
        // Bits above this digit that the key must share with the prefix (none at level 0).
        unsigned int high_mask = level == 0 ? 0u : (0xffffffffu << (shift + 8));
        for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) {
            float l = row[i];
            unsigned int k = order_key(l);
            if (k >= min_key && (k & high_mask) == (prefix & high_mask)) {
                unsigned int b = (k >> shift) & 0xffu;
                atomicAdd(&sh.count[b], 1u);
                // Top-k needs no masses per bin: its kept mass is summed once at the end.
                if (by_mass) atomicAdd(&sh.mass[b], quantize(exp_neg((l - max_logit) * inv_t)));
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long c = sh.above_count, m = sh.above_mass;
            int chosen = -1;
            for (int b = BINS - 1; b >= 0; --b) {
                unsigned long long here = by_mass ? m + sh.mass[b] : c + sh.count[b];
                if (here >= target) { chosen = b; break; }
                c += sh.count[b];
                m += sh.mass[b];
            }
            if (chosen < 0) {
                // Only possible at level 0: the tokens >= min_key fall short; keep them all.
                sh.found = 0;
                sh.prefix = min_key;
                sh.kept_count = c;
                sh.kept_mass = m;
            } else {
                sh.above_count = c;
                sh.above_mass = m;
                sh.prefix = prefix | ((unsigned int)chosen << shift);
                if (level == 3) {
                    sh.kept_count = c + sh.count[chosen];
                    sh.kept_mass = m + sh.mass[chosen];
                }
            }
        }
        __syncthreads();
        if (!sh.found) break;
    }
    if (!by_mass) {
        // Top-k accumulated no masses per bin: sum the kept mass directly.
        unsigned int key = sh.prefix;
        unsigned long long local = 0;
        for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) {
            float l = row[i];
            if (order_key(l) >= key) local += quantize(exp_neg((l - max_logit) * inv_t));
        }
        unsigned long long kept = block_sum_u64(local, sh);
        if (threadIdx.x == 0) sh.kept_mass = kept;
        __syncthreads();
    }
}

// ------------------------------------------------------------------ the sampler ----

// One block of THREADS threads per row. keys: 3 u64 per row (seed, stream, position).
// top_k == 0: no top-k (the host also passes 0 when k >= vocab); top_p >= 1: no top-p.
// greedy != 0: argmax, log-prob at T = 1 (the host passes inv_t = temperature = 1).
// A row with NaN or +inf logits, or none finite, gets token 0xffffffff and a NaN log-prob.
// __launch_bounds__: ptxas must fit a 1024-thread block (at most 64 registers a thread; it uses
// 56 on sm_90 with CUDA 13.0), or the launch would fail with "too many resources requested".
extern "C" __global__ void __launch_bounds__(THREADS) sample_rows(const float* __restrict__ logits, unsigned int vocab,
                                       float temperature, float inv_t, int greedy,
                                       unsigned int top_k, float top_p,
                                       const unsigned long long* __restrict__ keys,
                                       unsigned int* __restrict__ tokens,
                                       float* __restrict__ logprobs) {
    __shared__ Shared sh;
    const unsigned int r = blockIdx.x;
    const float* row = logits + (size_t)r * vocab;

    // (1) Online max + sum of exp((l - max) * inv_t), per thread, then across the block.
    float m = NEG_INF;
    double s = 0.0;
    int bad = 0;
    for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) {
        float l = row[i];
        bad |= isnan(l) || l == POS_INF;
        if (l == NEG_INF) continue;
        if (l > m) {
            s = (m == NEG_INF) ? 0.0 : s * exp((double)(m - l) * (double)inv_t);
            m = l;
        }
        s += (double)exp_neg((l - m) * inv_t);
    }
    bad = __syncthreads_or(bad);
    float max_logit = block_max(m, sh);
    if (bad || max_logit == NEG_INF) {
        if (threadIdx.x == 0) { tokens[r] = BAD_TOKEN; logprobs[r] = __int_as_float(0x7fc00000); }
        return;
    }
    double mine = (m == NEG_INF) ? 0.0 : s * exp((double)(m - max_logit) * (double)inv_t);
    double sum = block_sum_d(mine, sh);

    if (greedy) {
        unsigned int first = 0xffffffffu;
        for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) {
            if (row[i] == max_logit) { first = i; break; }
        }
        first = block_min_u32(first, sh);
        if (threadIdx.x == 0) { tokens[r] = first; logprobs[r] = (float)(-log(sum)); }
        return;
    }

    // (2) Thresholds: top-k, then top-p within the top-k set.
    unsigned int min_key = 0;
    unsigned long long kept_mass;
    if (top_k > 0) {
        threshold(row, vocab, max_logit, inv_t, 0, top_k, 0, sh);
        min_key = sh.prefix;
        kept_mass = sh.kept_mass;
    } else {
        unsigned long long local = 0;
        for (unsigned int i = threadIdx.x; i < vocab; i += THREADS)
            local += quantize(exp_neg((row[i] - max_logit) * inv_t));
        kept_mass = block_sum_u64(local, sh);
    }
    if (top_p < 1.0f) {
        threshold(row, vocab, max_logit, inv_t, 1, top_p_target(top_p, kept_mass), min_key, sh);
        min_key = sh.prefix;
        kept_mass = sh.kept_mass;
    }

    // (3) Inverse-CDF draw: first token (index order) whose running kept mass exceeds target.
    const unsigned long long* key = keys + 3 * (size_t)r;
    unsigned long long target = scale_uniform(philox_word0(key[0], key[1], key[2]), kept_mass);
    if (threadIdx.x == 0) sh.token = BAD_TOKEN;
    __syncthreads();
    unsigned long long acc = 0;
    for (unsigned int base = 0; base < vocab; base += THREADS * ITEMS) {
        unsigned int start = base + threadIdx.x * ITEMS;
        unsigned long long q[ITEMS];
        unsigned long long mine_sum = 0;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            unsigned int i = start + j;
            q[j] = 0;
            if (i < vocab) {
                float l = row[i];
                if (order_key(l) >= min_key) q[j] = quantize(exp_neg((l - max_logit) * inv_t));
            }
            mine_sum += q[j];
        }
        unsigned long long tile_total;
        unsigned long long before = acc + block_exclusive_scan(mine_sum, sh, &tile_total);
        if (before <= target && target < before + mine_sum) {
            unsigned long long run = before;
            for (int j = 0; j < ITEMS; ++j) {
                run += q[j];
                if (run > target) { sh.token = start + j; break; }
            }
        }
        __syncthreads();
        if (sh.token != BAD_TOKEN) break;
        acc += tile_total;
    }

    // (4) Behaviour log-prob of the drawn token over the full vocabulary, before truncation.
    if (threadIdx.x == 0) {
        unsigned int t = sh.token;
        tokens[r] = t;
        logprobs[r] = t == BAD_TOKEN
            ? __int_as_float(0x7fc00000)
            : (float)((double)(row[t] - max_logit) / (double)temperature - log(sum));
    }
}

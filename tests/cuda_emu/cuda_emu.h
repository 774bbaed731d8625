// A CPU emulation of the CUDA C subset our kernels use (with mma.sync and ldmatrix of bf16), so that
// actor/src/sampler/kernels/*.cu compile unchanged as C++20 and run on the host: every CUDA
// thread of a block is an OS thread, __syncthreads() is a block barrier, warp shuffles go through
// a per-warp exchange buffer between two warp barriers, shared-memory atomics are atomic
// read-modify-writes. Blocks run one after another (so a function-local `static` stands for
// `__shared__`), and the block's shared memory is filled with garbage before each block (on a
// GPU it starts undefined). Compile with -ffp-contract=off (NVRTC runs with --fmad=false)
// on x86-64 (SSE floats), so float arithmetic rounds as on the device. Threads leave the
// barriers when they return from the kernel, as exited GPU threads stop counting at bar.sync.
#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

namespace cuda_emu {
using Barrier = std::barrier<>;

struct BlockSync {
    std::unique_ptr<Barrier> block;
    std::vector<std::unique_ptr<Barrier>> warps;
    std::vector<std::uint64_t> lanes;  // one exchange slot per thread
    std::vector<std::array<unsigned int, 6>> mma;  // per thread: A (4 words), B (2 words)
    std::atomic<int> vote{0};
};

inline thread_local dim3 thread_idx, block_idx;
inline thread_local BlockSync* sync_of_block = nullptr;
inline dim3 block_dim, grid_dim;

// Every __shared__ variable is placed in this section (see the macro below); the linker defines
// its bounds.
extern "C" __attribute__((weak)) char __start_cuda_emu_shared[];
extern "C" __attribute__((weak)) char __stop_cuda_emu_shared[];

// Shared memory starts undefined on a GPU: give the kernel garbage, not last block's values.
inline void poison_shared() {
    if (__start_cuda_emu_shared != nullptr)
        std::memset(__start_cuda_emu_shared, 0xA5,
                    static_cast<std::size_t>(__stop_cuda_emu_shared - __start_cuda_emu_shared));
}

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "cuda_emu: %s\n", what);
    std::abort();
}

inline void check_full_mask(unsigned int mask) {
    // The kernels shuffle with all 32 lanes; a partial warp is not emulated.
    if (mask != 0xffffffffu || block_dim.x % 32 != 0) fail("shuffle needs full warps");
}

// Runs `kernel(args...)` over `grid` blocks of `block` threads (x dimension only).
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
    if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1) fail("1-D launches only");
    grid_dim = grid;
    block_dim = block;
    const unsigned int threads = block.x;
    const unsigned int warps = (threads + 31) / 32;
    std::vector<BlockSync> syncs(grid.x);
    for (auto& s : syncs) {
        s.block = std::make_unique<Barrier>(threads);
        for (unsigned int w = 0; w < warps; ++w)
            s.warps.push_back(std::make_unique<Barrier>(std::min(32u, threads - 32 * w)));
        s.lanes.assign(threads, 0);
        s.mma.assign(threads, {});
    }
    Barrier between_blocks(threads);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            thread_idx = dim3{t, 0, 0};
            for (unsigned int b = 0; b < grid.x; ++b) {
                if (t == 0) poison_shared();
                between_blocks.arrive_and_wait();
                block_idx = dim3{b, 0, 0};
                sync_of_block = &syncs[b];
                kernel(args...);
                syncs[b].block->arrive_and_drop();
                syncs[b].warps[t / 32]->arrive_and_drop();
                between_blocks.arrive_and_wait();
            }
        });
    }
    for (auto& th : pool) th.join();
}
}  // namespace cuda_emu

#define threadIdx (cuda_emu::thread_idx)
#define blockIdx (cuda_emu::block_idx)
#define blockDim (cuda_emu::block_dim)
#define gridDim (cuda_emu::grid_dim)
#define __global__
#define __launch_bounds__(...)
#define __device__
#define __forceinline__ inline
// Blocks run one at a time, so one static per __shared__ variable is the block's shared memory;
// all of them sit in one section, which is poisoned before each block.
#define __shared__ static __attribute__((section("cuda_emu_shared"), used))

inline void __syncthreads() { cuda_emu::sync_of_block->block->arrive_and_wait(); }

inline int __syncthreads_or(int predicate) {
    auto* s = cuda_emu::sync_of_block;
    __syncthreads();
    if (threadIdx.x == 0) s->vote.store(0);
    __syncthreads();
    if (predicate) s->vote.fetch_or(1);
    __syncthreads();
    int r = s->vote.load();
    __syncthreads();
    return r;
}

template <class T>
T shuffle_from(T v, unsigned int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    auto* s = cuda_emu::sync_of_block;
    unsigned int t = threadIdx.x, warp = t / 32;
    std::memcpy(&s->lanes[t], &v, sizeof(T));
    s->warps[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &s->lanes[warp * 32 + src_lane], sizeof(T));
    s->warps[warp]->arrive_and_wait();
    return r;
}

namespace cuda_emu {
inline float bf16_word_to_f32(unsigned int half) {
    const unsigned int bits = (half & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling warp, with the PTX ISA's
// fragment layouts: lane = 4 g + c holds A (16 x 16) elements (g, 2c..2c+1), (g + 8, 2c..),
// (g, 2c + 8..), (g + 8, 2c + 8..) in a[0..4], B (16 x 8, k x n) elements (k 2c..2c+1, n g) and
// (k 2c + 8.., n g) in b0, b1 (two bf16 per word, the lower index in the low half), and C/D
// elements (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1) in c[0..4]. The products are
// summed in double and added to c once (the hardware's internal precision is at least f32).
inline void mma_m16n8k16_bf16(float (&c)[4], const unsigned int (&a)[4], unsigned int b0,
                              unsigned int b1) {
    auto* s = sync_of_block;
    check_full_mask(0xffffffffu);
    const unsigned int t = threadIdx.x, warp = t / 32, lane = t % 32;
    s->mma[t] = {a[0], a[1], a[2], a[3], b0, b1};
    s->warps[warp]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (unsigned int l = 0; l < 32; ++l) {
        const auto& f = s->mma[warp * 32 + l];
        const unsigned int g = l / 4, cc = l % 4;
        const unsigned int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * cc, 2 * cc, 2 * cc + 8,
                                                                       2 * cc + 8};
        for (int r = 0; r < 4; ++r) {
            A[rows[r]][cols[r]] = bf16_word_to_f32(f[r]);
            A[rows[r]][cols[r] + 1] = bf16_word_to_f32(f[r] >> 16);
        }
        B[2 * cc][g] = bf16_word_to_f32(f[4]);
        B[2 * cc + 1][g] = bf16_word_to_f32(f[4] >> 16);
        B[2 * cc + 8][g] = bf16_word_to_f32(f[5]);
        B[2 * cc + 9][g] = bf16_word_to_f32(f[5] >> 16);
    }
    s->warps[warp]->arrive_and_wait();
    const unsigned int g = lane / 4, cc = lane % 4;
    for (unsigned int e = 0; e < 4; ++e) {
        const unsigned int r = g + (e >= 2 ? 8 : 0), col = 2 * cc + (e & 1);
        double sum = 0.0;
        for (int k = 0; k < 16; ++k) sum += double(A[r][k]) * double(B[k][col]);
        c[e] = static_cast<float>(double(c[e]) + sum);
    }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for the calling warp: lane 8 i + j gives the
// address of row j (8 consecutive 16-bit elements, 16-byte aligned) of matrix i; lane 4 g + c
// receives in r[i] elements (g, 2c) and (g, 2c + 1) of matrix i, or with `trans` elements
// (2c, g) and (2c + 1, g), the lower one in the low half.
inline void ldmatrix_x4(unsigned int (&r)[4], const void* row, bool trans) {
    auto* s = sync_of_block;
    check_full_mask(0xffffffffu);
    const unsigned int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const auto at = reinterpret_cast<std::uintptr_t>(row);
    if (at % 16 != 0) fail("ldmatrix row address not 16-byte aligned");
    s->lanes[t] = at;
    s->warps[warp]->arrive_and_wait();
    const unsigned int g = lane / 4, c = lane % 4;
    for (unsigned int i = 0; i < 4; ++i) {
        auto elem = [&](unsigned int rj, unsigned int col) {
            const char* base = reinterpret_cast<const char*>(s->lanes[warp * 32 + 8 * i + rj]);
            unsigned short h;
            std::memcpy(&h, base + 2 * col, 2);
            return static_cast<unsigned int>(h);
        };
        r[i] = trans ? elem(2 * c, g) | (elem(2 * c + 1, g) << 16)
                     : elem(g, 2 * c) | (elem(g, 2 * c + 1) << 16);
    }
    s->warps[warp]->arrive_and_wait();
}
}  // namespace cuda_emu

template <class T>
T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    cuda_emu::check_full_mask(mask);
    return shuffle_from(v, (threadIdx.x % 32) ^ static_cast<unsigned int>(lane_mask));
}

template <class T>
T __shfl_up_sync(unsigned int mask, T v, unsigned int delta) {
    cuda_emu::check_full_mask(mask);
    unsigned int lane = threadIdx.x % 32;
    return shuffle_from(v, lane >= delta ? lane - delta : lane);
}

inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
// The device's fast exponential (ex2.approx of x log2(e), a few ulp); here the libm one.
inline float __expf(float x) { return std::exp(x); }
using std::isnan;

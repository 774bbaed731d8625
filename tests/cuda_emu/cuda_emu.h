// A CPU emulation of the CUDA C subset the sampler kernels use, so that
// actor/src/sampler/kernels/*.cu compile unchanged as C++20 and run on the host: every CUDA
// thread of a block is an OS thread, __syncthreads() is a block barrier, warp shuffles go through
// a per-warp exchange buffer between two warp barriers, shared-memory atomics are atomic
// read-modify-writes. Blocks run one after another (so a function-local `static` stands for
// `__shared__`), and the block's shared memory is filled with garbage before each block (on a
// GPU it starts undefined). Compile with -ffp-contract=off (NVRTC runs with --fmad=false)
// on x86-64 (SSE floats), so float arithmetic rounds as on the device. Threads leave the
// barriers when they return from the kernel, as exited GPU threads stop counting at bar.sync.
#pragma once

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
using std::isnan;

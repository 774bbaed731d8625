// Runs the paged decode attention kernel of shared/src/model/paged/kernels/paged_attn.cu
// (included as KERNEL_SOURCE, with tests/cuda_emu/cuda_emu.h force-included) on the CPU, with the
// launch shapes of shared/src/model/paged/cuda.rs: the decode kernel alone (splits == 1), or
// with splits > 1 the decode kernel writing its records to a workspace and the combine kernel.
// Driven by shared/tests/paged_attn_kernel_emulated.rs through little-endian binary files:
//
//   paged_attn_emu IN OUT
//   IN:  u32 dtype (0 f32, 1 bf16), u32 rows, heads, kv_heads, d, pool_rows, width, f32 scale,
//        u32 splits, split_blocks (SplitPlan of shared/src/model/paged/kernels.rs);
//        u32 blocks[rows * width], u32 lens[rows]; q (rows * heads * d elements of the dtype),
//        k pool, v pool (pool_rows * kv_heads * d elements each).
//   OUT: out (rows * heads * d elements).
//
// The workspace and out start as NaN, so that a record or an output element that no block
// writes shows up as a NaN.

#include <algorithm>
#include <cstdint>
#include <limits>

// __syncwarp, which cuda_emu.h does not provide: a barrier of the calling thread's warp (all 32
// lanes take part in every call of the kernel).
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    cuda_emu::check_full_mask(mask);
    cuda_emu::sync_of_block->warps[threadIdx.x / 32]->arrive_and_wait();
}

#include KERNEL_SOURCE

#include "cuda_emu_io.h"

namespace {
struct Shape {
    unsigned int rows, heads, kv_heads, d, pool_rows, width;
    float scale;
    unsigned int splits, split_blocks;
};

template <class T>
using Decode = void (*)(const T*, const T*, const T*, const unsigned int*, const unsigned int*,
                        T*, float*, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, float);
template <class T>
using Combine = void (*)(const float*, T*, unsigned int, unsigned int);

template <class T>
void run(const Shape& s, Decode<T> kernel, Combine<T> combine, T nan, cuda_emu::Reader& in,
         const char* out_path) {
    const auto blocks = in.array<unsigned int>(std::size_t(s.rows) * s.width);
    const auto lens = in.array<unsigned int>(s.rows);
    const std::size_t nq = std::size_t(s.rows) * s.heads * s.d;
    const std::size_t nk = std::size_t(s.pool_rows) * s.kv_heads * s.d;
    const auto q = in.array<T>(nq);
    const auto k = in.array<T>(nk);
    const auto v = in.array<T>(nk);
    if (in.at != in.buf.size()) cuda_emu::fail("input longer than its header says");
    // What the launcher checks on the host: every row's pool rows lie inside the pool.
    for (unsigned int r = 0; r < s.rows; ++r) {
        const unsigned int len = lens[r];
        if (len == 0 || (len + PA_BLOCK_TOKENS - 1) / PA_BLOCK_TOKENS > s.width)
            cuda_emu::fail("row length");
        for (unsigned int b = 0; b < (len + PA_BLOCK_TOKENS - 1) / PA_BLOCK_TOKENS; ++b)
            if ((std::size_t(blocks[std::size_t(r) * s.width + b]) + 1) * PA_BLOCK_TOKENS >
                s.pool_rows)
                cuda_emu::fail("block outside the pool");
    }
    // What the launcher guarantees: the splits cover every row.
    unsigned int max_blocks = 0;
    for (unsigned int r = 0; r < s.rows; ++r)
        max_blocks = std::max(max_blocks, (lens[r] + PA_BLOCK_TOKENS - 1) / PA_BLOCK_TOKENS);
    if (s.splits == 0 || std::size_t(s.splits) * s.split_blocks < max_blocks)
        cuda_emu::fail("the splits do not cover the rows");
    std::vector<T> out(nq, nan);
    // The workspace (rows * heads * splits records of d + 2 floats; none when unsplit).
    std::vector<float> part;
    if (s.splits > 1)
        part.assign(std::size_t(s.rows) * s.heads * s.splits * (s.d + 2),
                    std::numeric_limits<float>::quiet_NaN());
    const unsigned int rep = s.heads / s.kv_heads;
    const unsigned int q_chunks = (rep + PA_QUERIES - 1) / PA_QUERIES;
    if (s.rows > 0) {
        cuda_emu::launch(dim3{s.rows * s.kv_heads * s.splits * q_chunks, 1, 1},
                         dim3{THREADS, 1, 1}, kernel, q.data(), k.data(), v.data(),
                         blocks.data(), lens.data(), out.data(),
                         s.splits > 1 ? part.data() : static_cast<float*>(nullptr), s.heads,
                         s.kv_heads, s.d, s.width, q_chunks, s.splits, s.split_blocks, s.scale);
        if (s.splits > 1)
            cuda_emu::launch(dim3{s.rows * s.heads, 1, 1}, dim3{THREADS, 1, 1}, combine,
                             static_cast<const float*>(part.data()), out.data(), s.d, s.splits);
    }
    cuda_emu::spill(out_path, out.data(), nq * sizeof(T), false);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) cuda_emu::fail("usage: paged_attn_emu IN OUT");
    const std::vector<char> buf = cuda_emu::slurp(argv[1]);
    cuda_emu::Reader in{buf};
    const auto dtype = in.get<unsigned int>();
    Shape s{};
    s.rows = in.get<unsigned int>();
    s.heads = in.get<unsigned int>();
    s.kv_heads = in.get<unsigned int>();
    s.d = in.get<unsigned int>();
    s.pool_rows = in.get<unsigned int>();
    s.width = in.get<unsigned int>();
    s.scale = in.get<float>();
    s.splits = in.get<unsigned int>();
    s.split_blocks = in.get<unsigned int>();
    if (s.kv_heads == 0 || s.heads % s.kv_heads != 0) cuda_emu::fail("heads / kv_heads");
    if (s.d == 0 || s.d > PA_MAX_HEAD_DIM) cuda_emu::fail("head dim must be in 1..=128");
    // The entry point of cuda.rs: the d64 kernels for d <= 64, the d128 kernels above.
    const bool small = s.d <= 64;
    if (dtype == 0) {
        run<float>(s, small ? paged_decode_f32_d64 : paged_decode_f32_d128, paged_combine_f32,
                   std::numeric_limits<float>::quiet_NaN(), in, argv[2]);
    } else if (dtype == 1) {
        run<bf16_bits>(s, small ? paged_decode_bf16_d64 : paged_decode_bf16_d128,
                       paged_combine_bf16, bf16_bits{0x7fc0}, in, argv[2]);
    } else {
        cuda_emu::fail("unknown dtype");
    }
    return 0;
}

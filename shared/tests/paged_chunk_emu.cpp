// Runs the tensor-core paged prefill kernel (fam_paged_bf16_d* of
// shared/src/model/flash_attn/kernels/flash_attn_mma.cu, compiled after flash_attn.cu as NVRTC
// compiles them: KERNEL_SOURCE, then MMA_SOURCE, with tests/cuda_emu/cuda_emu.h force-included)
// on the CPU, with the launch shape of launch_chunk in shared/src/model/paged/cuda.rs (grid
// runs * heads, 128 threads). Driven by shared/tests/paged_attn_kernel_emulated.rs through
// little-endian binary files:
//
//   paged_chunk_emu IN OUT
//   IN:  u32 rows, heads, kv_heads, d, pool_rows, width, f32 scale, u32 n_runs;
//        u32 runs[2 * n_runs] ((first row, rows) pairs); u32 blocks[rows * width],
//        u32 lens[rows]; q (rows * heads * d bf16), k pool, v pool (pool_rows * kv_heads * d).
//   OUT: out (rows * heads * d bf16).
//
// The output starts as NaN, so that an element no block writes fails the test.
#include KERNEL_SOURCE
#include MMA_SOURCE

#include "cuda_emu_io.h"

int main(int argc, char** argv) {
    if (argc != 3) cuda_emu::fail("usage: paged_chunk_emu IN OUT");
    const std::vector<char> buf = cuda_emu::slurp(argv[1]);
    cuda_emu::Reader in{buf};
    const auto rows = in.get<unsigned int>();
    const auto heads = in.get<unsigned int>();
    const auto kv_heads = in.get<unsigned int>();
    const auto d = in.get<unsigned int>();
    const auto pool_rows = in.get<unsigned int>();
    const auto width = in.get<unsigned int>();
    const auto scale = in.get<float>();
    const auto n_runs = in.get<unsigned int>();
    const auto runs = in.array<unsigned int>(std::size_t(n_runs) * 2);
    const auto blocks = in.array<unsigned int>(std::size_t(rows) * width);
    const auto lens = in.array<unsigned int>(rows);
    const std::size_t nq = std::size_t(rows) * heads * d;
    const std::size_t nk = std::size_t(pool_rows) * kv_heads * d;
    const auto q = in.array<bf16_bits>(nq);
    const auto k = in.array<bf16_bits>(nk);
    const auto v = in.array<bf16_bits>(nk);
    if (in.at != in.buf.size()) cuda_emu::fail("input longer than its header says");
    if (kv_heads == 0 || heads % kv_heads != 0) cuda_emu::fail("heads / kv_heads");
    if (d == 0 || d > 128) cuda_emu::fail("head dim must be in 1..=128");
    // What the launcher guarantees: runs of at most 64 rows with one block list, covering the
    // rows in order, every row's pool rows inside the pool.
    unsigned int next = 0;
    for (unsigned int i = 0; i < n_runs; ++i) {
        const unsigned int first = runs[2 * i], n = runs[2 * i + 1];
        if (first != next || n == 0 || n > 64) cuda_emu::fail("runs do not tile the rows");
        for (unsigned int r = first; r < first + n; ++r)
            for (unsigned int c = 0; c < width; ++c)
                if (blocks[r * width + c] != blocks[first * width + c])
                    cuda_emu::fail("a run's rows read different blocks");
        next = first + n;
    }
    if (next != rows) cuda_emu::fail("runs do not cover the rows");
    for (unsigned int r = 0; r < rows; ++r) {
        const unsigned int len = lens[r];
        if (len == 0 || (len + 15) / 16 > width) cuda_emu::fail("a row's length");
        const unsigned int last = blocks[r * width + (len - 1) / 16] * 16 + (len - 1) % 16;
        if (last >= pool_rows) cuda_emu::fail("a row reads past the pool");
    }
    std::vector<bf16_bits> out(nq, bf16_bits(0x7fc0));
    if (n_runs > 0) {
        auto kernel = d <= 64 ? fam_paged_bf16_d64 : fam_paged_bf16_d128;
        cuda_emu::launch(dim3{n_runs * heads, 1, 1}, dim3{FAM_THREADS, 1, 1}, kernel, q.data(),
                         k.data(), v.data(), blocks.data(), lens.data(), runs.data(), out.data(),
                         heads, kv_heads, d, width, scale);
    }
    cuda_emu::spill(argv[2], out.data(), nq * sizeof(bf16_bits), false);
    return 0;
}

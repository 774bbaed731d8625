// Runs a sampler kernel of actor/src/sampler/kernels/sampler.cu (included as KERNEL_SOURCE, with
// tests/cuda_emu/cuda_emu.h force-included) on the CPU, with the launch shape of
// actor/src/sampler/cuda.rs.
// Driven by actor/tests/sampler_kernel_emulated.rs through little-endian binary files:
//
//   run_kernel sample IN OUT   IN: u32 vocab, u32 rows, f32 temperature, f32 inv_t, i32 greedy,
//                                  u32 top_k, f32 top_p, u32 threads; rows*vocab f32 logits;
//                                  rows*3 u64 keys.  OUT: rows u32 tokens, rows f32 logprobs.
//   run_kernel philox IN OUT   IN: u32 n; n*6 u32.  OUT: n u32.
#include KERNEL_SOURCE

#include <string>

#include "cuda_emu_io.h"


int main(int argc, char** argv) {
    if (argc != 4) cuda_emu::fail("usage: run_kernel sample|philox IN OUT");
    const std::string mode = argv[1];
    const std::vector<char> buf = cuda_emu::slurp(argv[2]);
    cuda_emu::Reader in{buf};
    if (mode == "sample") {
        const auto vocab = in.get<unsigned int>();
        const auto rows = in.get<unsigned int>();
        const auto temperature = in.get<float>();
        const auto inv_t = in.get<float>();
        const auto greedy = in.get<int>();
        const auto top_k = in.get<unsigned int>();
        const auto top_p = in.get<float>();
        const auto threads = in.get<unsigned int>();
        if (threads != THREADS) cuda_emu::fail("block size differs from the kernel's THREADS");
        const auto logits = in.array<float>(std::size_t(rows) * vocab);
        const auto keys = in.array<unsigned long long>(std::size_t(rows) * 3);
        std::vector<unsigned int> tokens(rows, 0);
        std::vector<float> logprobs(rows, 0.0f);
        cuda_emu::launch(dim3{rows, 1, 1}, dim3{threads, 1, 1}, sample_rows, logits.data(), vocab,
                         temperature, inv_t, greedy, top_k, top_p, keys.data(), tokens.data(),
                         logprobs.data());
        cuda_emu::spill(argv[3], tokens.data(), rows * 4, false);
        cuda_emu::spill(argv[3], logprobs.data(), rows * 4, true);
    } else if (mode == "philox") {
        const auto n = in.get<unsigned int>();
        const auto words = in.array<unsigned int>(std::size_t(n) * 6);
        std::vector<unsigned int> out(n, 0);
        // LaunchConfig::for_num_elems: blocks of 1024 threads.
        const unsigned int block = 1024, grid = (n + block - 1) / block;
        cuda_emu::launch(dim3{grid > 0 ? grid : 1, 1, 1}, dim3{block, 1, 1}, philox_kat,
                         words.data(), out.data(), static_cast<int>(n));
        cuda_emu::spill(argv[3], out.data(), std::size_t(n) * 4, false);
    } else {
        cuda_emu::fail("unknown mode");
    }
    return 0;
}

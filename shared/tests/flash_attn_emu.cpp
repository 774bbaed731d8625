// Runs the fused-attention kernels of shared/src/model/flash_attn/kernels/flash_attn.cu
// (included as KERNEL_SOURCE) and flash_attn_mma.cu (MMA_SOURCE, after it, as NVRTC compiles
// them), with tests/cuda_emu/cuda_emu.h force-included, on the CPU, with the launch shapes of
// shared/src/model/flash_attn/cuda.rs: the forward, then the backward (dq, then dkdv) on the
// forward's O and L. Driven by shared/tests/flash_attn_kernel_emulated.rs through
// little-endian binary files:
//
//   flash_attn_emu IN OUT
//   IN:  u32 kernels (0 f32, 1 bf16: fa_*; 2 bf16 on tensor cores: fam_*, 128 threads),
//        u32 b, heads, kv_heads, t, d, f32 scale, u32 n_segs;
//        u32 seg_off[b + 1], u32 segs[2 * n_segs]; q, k, v, dO (elements of the dtype).
//   OUT: O (elements), L (f32, b * heads * t), dQ, dK, dV (elements).
#include KERNEL_SOURCE
#include MMA_SOURCE

#include <string>
#include <type_traits>

#include "cuda_emu_io.h"

namespace {
// The entry points of one (dtype, DMAX) instantiation.
template <class T, int DMAX>
struct Entries;
#define ENTRIES(T, NAME, DMAX)                                   \
    template <>                                                  \
    struct Entries<T, DMAX> {                                    \
        static constexpr auto fwd = fa_fwd_##NAME##_d##DMAX;     \
        static constexpr auto dq = fa_dq_##NAME##_d##DMAX;       \
        static constexpr auto dkdv = fa_dkdv_##NAME##_d##DMAX;   \
    };
ENTRIES(float, f32, 64)
ENTRIES(float, f32, 128)
ENTRIES(bf16_bits, bf16, 64)
ENTRIES(bf16_bits, bf16, 128)

// The tensor-core kernels (bf16 only).
template <int DMAX>
struct MmaEntries;
#define MMA_ENTRIES(DMAX)                                     \
    template <>                                               \
    struct MmaEntries<DMAX> {                                 \
        static constexpr auto fwd = fam_fwd_bf16_d##DMAX;     \
        static constexpr auto dq = fam_dq_bf16_d##DMAX;       \
        static constexpr auto dkdv = fam_dkdv_bf16_d##DMAX;   \
    };
MMA_ENTRIES(64)
MMA_ENTRIES(128)

struct Shape {
    unsigned int b, heads, kv_heads, t, d;
    float scale;
};

template <class T, int DMAX, bool MMA>
void run(const Shape& s, const std::vector<unsigned int>& seg_off,
         const std::vector<unsigned int>& segs, cuda_emu::Reader& in, const char* out_path) {
    const std::size_t nq = std::size_t(s.b) * s.heads * s.t * s.d;
    const std::size_t nk = std::size_t(s.b) * s.kv_heads * s.t * s.d;
    const std::size_t rows = std::size_t(s.b) * s.heads * s.t;
    const auto q = in.array<T>(nq);
    const auto k = in.array<T>(nk);
    const auto v = in.array<T>(nk);
    const auto d_o = in.array<T>(nq);
    if (in.at != in.buf.size()) cuda_emu::fail("input longer than its header says");
    std::vector<T> out(nq), dq(nq), dk(nk), dv(nk);
    std::vector<float> lse(rows), delta(rows);
    using Tl = Tiles<DMAX>;
    using Mt = MmaTiles<DMAX>;
    const unsigned int fwd_m = MMA ? Mt::FWD_M : Tl::FWD_M;
    const unsigned int dq_m = MMA ? Mt::DQ_M : Tl::BWD_M;
    const unsigned int dkdv_n = MMA ? Mt::DKDV_N : Tl::BWD_N;
    const unsigned int q_blocks = (s.t + fwd_m - 1) / fwd_m;
    const unsigned int dq_blocks = (s.t + dq_m - 1) / dq_m;
    const unsigned int k_blocks = (s.t + dkdv_n - 1) / dkdv_n;
    const dim3 block{MMA ? FAM_THREADS : THREADS, 1, 1};
    using E = std::conditional_t<MMA, MmaEntries<DMAX>, Entries<T, DMAX>>;
    if (s.t > 0) {
        cuda_emu::launch(dim3{s.b * s.heads * q_blocks, 1, 1}, block, E::fwd,
                         q.data(), k.data(), v.data(), seg_off.data(), segs.data(), out.data(),
                         lse.data(), s.heads, s.kv_heads, s.t, s.d, s.scale, q_blocks);
        cuda_emu::launch(dim3{s.b * s.heads * dq_blocks, 1, 1}, block, E::dq,
                         q.data(), k.data(), v.data(), static_cast<const T*>(out.data()),
                         d_o.data(), static_cast<const float*>(lse.data()), seg_off.data(),
                         segs.data(), dq.data(), delta.data(), s.heads, s.kv_heads, s.t, s.d,
                         s.scale, dq_blocks);
        cuda_emu::launch(dim3{s.b * s.kv_heads * k_blocks, 1, 1}, block,
                         E::dkdv, q.data(), k.data(), v.data(), d_o.data(),
                         static_cast<const float*>(lse.data()),
                         static_cast<const float*>(delta.data()), seg_off.data(), segs.data(),
                         dk.data(), dv.data(), s.heads, s.kv_heads, s.t, s.d, s.scale, k_blocks);
    }
    cuda_emu::spill(out_path, out.data(), nq * sizeof(T), false);
    cuda_emu::spill(out_path, lse.data(), rows * sizeof(float), true);
    cuda_emu::spill(out_path, dq.data(), nq * sizeof(T), true);
    cuda_emu::spill(out_path, dk.data(), nk * sizeof(T), true);
    cuda_emu::spill(out_path, dv.data(), nk * sizeof(T), true);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) cuda_emu::fail("usage: flash_attn_emu IN OUT");
    const std::vector<char> buf = cuda_emu::slurp(argv[1]);
    cuda_emu::Reader in{buf};
    const auto dtype = in.get<unsigned int>();
    Shape s{};
    s.b = in.get<unsigned int>();
    s.heads = in.get<unsigned int>();
    s.kv_heads = in.get<unsigned int>();
    s.t = in.get<unsigned int>();
    s.d = in.get<unsigned int>();
    s.scale = in.get<float>();
    const auto n_segs = in.get<unsigned int>();
    const auto seg_off = in.array<unsigned int>(s.b + 1);
    const auto segs = in.array<unsigned int>(std::size_t(n_segs) * 2);
    if (s.kv_heads == 0 || s.heads % s.kv_heads != 0) cuda_emu::fail("heads / kv_heads");
    if (s.d == 0 || s.d > 128) cuda_emu::fail("head dim must be in 1..=128");
    const bool small = s.d <= 64;
    if (dtype == 0) {
        small ? run<float, 64, false>(s, seg_off, segs, in, argv[2])
              : run<float, 128, false>(s, seg_off, segs, in, argv[2]);
    } else if (dtype == 1) {
        small ? run<bf16_bits, 64, false>(s, seg_off, segs, in, argv[2])
              : run<bf16_bits, 128, false>(s, seg_off, segs, in, argv[2]);
    } else if (dtype == 2) {
        small ? run<bf16_bits, 64, true>(s, seg_off, segs, in, argv[2])
              : run<bf16_bits, 128, true>(s, seg_off, segs, in, argv[2]);
    } else {
        cuda_emu::fail("unknown dtype");
    }
    return 0;
}

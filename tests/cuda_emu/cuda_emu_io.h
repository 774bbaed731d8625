// Little-endian binary file input/output for the emulation drivers (actor/tests/sampler_emu.cpp,
// shared/tests/flash_attn_emu.cpp): the Rust tests write the kernel inputs to a file, the driver
// launches the kernels under cuda_emu.h and writes the outputs to another.
#pragma once

#include <fstream>
#include <iterator>
#include <vector>

namespace cuda_emu {
inline std::vector<char> slurp(const char* path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open input");
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct Reader {
    const std::vector<char>& buf;
    std::size_t at = 0;
    template <class T>
    T get() {
        T v;
        if (at + sizeof(T) > buf.size()) fail("input too short");
        std::memcpy(&v, buf.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    template <class T>
    std::vector<T> array(std::size_t n) {
        std::vector<T> v(n);
        if (at + n * sizeof(T) > buf.size()) fail("input too short");
        std::memcpy(v.data(), buf.data() + at, n * sizeof(T));
        at += n * sizeof(T);
        return v;
    }
};

inline void spill(const char* path, const void* data, std::size_t bytes, bool append) {
    std::ofstream f(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!f) fail("cannot write output");
}
}  // namespace cuda_emu

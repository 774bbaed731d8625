//! Token samplers: the CPU reference and the CUDA kernels (feature `cuda-kernels`).

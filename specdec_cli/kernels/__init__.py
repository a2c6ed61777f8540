"""specdec's C++ CPU kernels (int4 matmul with int8 activations, static-cache attention) and the
quantization that puts a model on them: optional, with the stock paths as the fallback."""

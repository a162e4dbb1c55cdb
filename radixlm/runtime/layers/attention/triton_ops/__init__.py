"""Triton kernels over the paged KV pool (CUDA only; imported lazily by the Triton attention backend)."""

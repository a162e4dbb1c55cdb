"""Triton kernels over the paged KV pool (CUDA only; the Triton attention backend imports the kernels lazily)."""

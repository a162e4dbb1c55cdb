"""The compute kernels the layers launch, by concern, each sub-package's `__init__` its public interface (other
packages import from there, never a sub-module's name):

  gemm/         the one GEMM entry point of linear layers and the lm_head (dispatch.linear): the few-row Triton
                kernels, tuned cuBLASLt configurations (gemm/tuned/*.json), oneDNN-packed CPU weights, and the
                element-wise steps a GEMM may fuse (prologue, epilogue)
  attention/    Triton attention over the paged KV pool (decode, extend, shared-prefix) and its host-side sizing
  moe/          the experts' routing and grouped GEMM
  elementwise/  RMSNorm, SiLU-and-mul, the rotary embedding, the KV store, the sampler's row argmax
  quant/        the quantized layouts' arithmetic (reference.py, the CPU path) and GEMMs: FP8 per-tensor / per-channel
                (torch._scaled_mm), FP8 128x128 blocks and W4A16 (Triton), behind fp8_linear and int4_linear
  startup/      what start-up builds before the first request: the variant inventory and warm-up plan, parallel
                builds, and the warm-up passes of one model runner

gemm, attention, moe, elementwise and quant import nothing above this package. startup runs a model runner's passes
and so reads the layers (which kernels a model launches) and the runner (kernels.startup.warmup.WarmupRunner).
Triton-only modules load on first use of one of their names (each package's `__getattr__`), so that a CPU process
imports none it does not call."""

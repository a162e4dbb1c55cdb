"""The benchmarks' shared library: scripts under benchmarks/<topic>/ import these modules (with the repository root on
sys.path), never each other, and nothing from tests/.

  engine            the Llama-3.1-8B engine, the decode-step measurement, offline workloads, ab_workloads (the peers')
  models            model directories: Llama-3.1-8B (dummy weights), its tiny shape, 8B shapes with another tokenizer
  moe               MoE engines with dummy weights: model directories, decode step against touched experts, offline
  profiling         PassClock (events per pass), step_kernels (torch.profiler; attention_us), step_profile (host phases),
                    Triton cache
  phases            PhaseTimer: the scheduler's phases timed without a profiler
  gpu_timing        GEMM shapes, CUDA-graph timing over weight copies (wall clock in dry runs), probes' budgets and
                    result files, the tree measured
  quant_formats     the quantized GEMM formats' bytes floors and relative error (the quant kernel benchmarks)
  json_workload     the JSON-decoding workload, one engine per jump-forward mode, scripted (replayed) logits
  speculative_replay  8B-shaped target and 1B-shaped draft directories, recorded tokens replayed as logits
  null_runner       a model-free ModelRunner for scheduling studies
  soak_traffic      the soak test's request kinds and classification
  vlm_checkpoints   VLM model directories (tiny Qwen2-VL with weights, 7B shapes config-only)
"""

"""The benchmarks' shared library: scripts under benchmarks/<topic>/ import these modules (with the repository root on
sys.path), never each other, and nothing from tests/.

  engine            the Llama-3.1-8B engine, the decode-step measurement, offline workloads, ab_workloads (the peers')
  models            model directories: Llama-3.1-8B (dummy weights), its tiny shape, 8B shapes with another tokenizer
  moe               MoE engines with dummy weights: model directories, decode step against touched experts, offline
  profiling         PassClock (events per pass) and its passes by row count, step_kernels (torch.profiler;
                    attention_us), step_profile (host phases), Triton cache, few-row GEMM kernels left out of start-up's choice
  phases            PhaseTimer: the scheduler's phases timed without a profiler
  gpu_timing        GEMM shapes, CUDA-graph timing over weight copies (wall clock in dry runs), probes' budgets and
                    result files, the tree measured
  quant_sweep       the quantized GEMM formats (bytes floors, relative error) and the quant kernel sweeps' candidates,
                    bucket sweep and tuned-table merge
  mla_cases         the MLA decode kernel's cases, reference, timing, profile and sweep summary
  json_workload     the JSON-decoding workload, one engine per jump-forward mode, scripted (replayed) logits
  speculative_replay  8B-shaped target and 1B-shaped draft directories, recorded tokens replayed as logits
  null_runner       a model-free ModelRunner for scheduling studies
  host_queue, retraction   the model-free scheduling studies (scheduler/scheduler_sim.py's kinds; --kind schedules
                    lives in that script)
  hicache_null      the scheduler's host work on the hierarchical cache's multi-turn stream, model-free
                    (serving/hicache_multiturn.py --null-runner)
  router_runs       two workers for the router benchmarks, their load counters, the feedback workload and driver
  targets           started server and router processes (process groups, readiness, resident memory, stop)
  soak_traffic      the soak test's request kinds and classification
  isolated          a function in a fresh process of its own, partial results kept
  allreduce         the all-reduce latency ranks (multi_gpu/gpu_multi.py --parts allreduce)
  vlm_checkpoints   VLM model directories (tiny Qwen2-VL with weights, 7B shapes config-only)
  kinds             command lines of scripts that hold several benchmarks (--kind K, then K's options)
  ab_report         medians and ratios of ab/ab_trees.sh's A/B (python -m benchmarks.lib.ab_report)
The lease scripts source env.sh (wheels, multicast off, DRY=1 on the CPU, budget_step) and run tree_id.sh.
"""

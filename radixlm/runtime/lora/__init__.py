"""Multi-LoRA serving: PEFT adapters applied per request in one batch.

- config.py: `--lora-paths` entries and PEFT's adapter_config.json; LoraTarget, our fused projections.
- registry.py: the front's adapters (name -> LoraRef), requests' lora_path and OpenAI model names, and the radix
  cache namespace of a request (`cache_namespace`).
- slots.py: the scheduler's slot table (which adapter each device slot holds, LRU, pinned while requests use it).
- adapter.py: an adapter's host copy. layer.py: a linear layer's slot buffers. manager.py: the executor's side.
- ops.py: the batched delta (torch path; the Triton kernels' slot). graph.py: the static LoRA input of CUDA-graph
  decode (each row's slot, rows grouped by slot).

This package's __init__ imports nothing: the front imports registry.py without torch."""

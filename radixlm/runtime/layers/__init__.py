"""The nn modules models are built of: linear layers (tensor-parallel shards), RMSNorm, activation, rotary embeddings,
RadixAttention and the MoE layer. They launch the kernels of runtime/kernels/ through its packages' interfaces.
The attention backends (attention/) are layers too: a pass's metadata (ForwardBatch) reaches them through
RadixAttention, the model runner picks one per run, and the torch one calls no kernel of ours."""

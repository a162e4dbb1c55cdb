"""Moving a room's KV between a prefill and a decode server (docs/disaggregation.md): the interface
(transfer.py) and its backends. The scheduler's two sides are scheduler/disagg_prefill.py and disagg_decode.py."""

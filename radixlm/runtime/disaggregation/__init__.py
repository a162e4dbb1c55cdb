"""Prefill/decode disaggregation (docs/disaggregation.md): the prefill server's side (prefill.py), the decode
server's side (decode.py) and the transfer of a request's KV between them (transfer.py, zmq_backend.py)."""

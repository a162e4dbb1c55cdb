"""LogitsOutput.as_float: float32 logits for whatever computes with them, the sample and verify rows still views of
one tensor of the pass's own."""
from __future__ import annotations

import torch

from radixlm.runtime.executor.forward_batch import ForwardMode
from radixlm.runtime.executor.logits import LogitsOutput, LogitsPlan, split_rows


def test_as_float_keeps_the_rows_one_tensor_and_their_values():
    rows = torch.randn(5, 11).to(torch.bfloat16)
    out = split_rows(rows, LogitsPlan(sample_rows=[0, 1], verify_rows=[2, 3, 4]), [], [], ForwardMode.TOKEN_ROWS)
    f = out.as_float()
    assert f.rows.dtype == f.next_token_logits.dtype == f.verify_logits.dtype == torch.float32
    assert torch.equal(f.rows, rows.float())
    assert f.next_token_logits.data_ptr() == f.rows.data_ptr()
    assert f.verify_logits.data_ptr() == f.rows[2:].data_ptr()
    assert torch.equal(f.next_token_logits.argmax(-1), rows[:2].argmax(-1))  # the cast is exact


def test_as_float_without_rows_and_when_already_float32():
    logits = torch.randn(3, 7).to(torch.bfloat16)
    out = LogitsOutput(logits, [], [], forward_mode=ForwardMode.TOKEN_ROWS)
    f = out.as_float()
    assert f.next_token_logits.dtype == torch.float32 and f.verify_logits is None and f.rows is None
    assert f.as_float() is f

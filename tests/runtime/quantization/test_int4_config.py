"""INT4 configs read from quantization_config: AWQ's and GPTQ's key spellings, group size -1, checkpoint formats,
compressed-tensors' W4A16 arguments, and modules_to_not_convert's matching."""
from __future__ import annotations

import pytest

from radixlm.runtime.quantization import quant_config_from
from radixlm.runtime.quantization.awq import AWQConfig
from radixlm.runtime.quantization.compressed_w4a16 import W4A16Scheme
from radixlm.runtime.quantization.gptq import GPTQConfig
from radixlm.runtime.quantization.int4_method import module_skipped


class _Cfg:
    def __init__(self, qc):
        self.quantization_config = qc

    def get_text_config(self):
        return self


def test_awq_and_gptq_keys():
    awq = quant_config_from(_Cfg({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True,
                                  "version": "GEMM", "modules_to_not_convert": ["gate"]}), "awq")
    assert awq == AWQConfig(64, ("gate",))
    gptq = quant_config_from(_Cfg({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": True,
                                   "sym": False, "format": "gptq_v2"}), None)
    assert gptq == GPTQConfig(-1, True, False, False)
    assert quant_config_from(_Cfg({"quant_method": "gptq", "bits": 4, "group_size": 128}), None).v1


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "awq", "bits": 3, "group_size": 128}, "3-bit"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "8-bit"),
    ({"quant_method": "gptq", "group_size": 128}, "no bit width"),
    ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group_size must be positive or -1"),
    ({"quant_method": "awq", "bits": 4, "version": "marlin"}, "version 'marlin'"),
])
def test_refusals(qc, message):
    with pytest.raises(ValueError) as e:
        quant_config_from(_Cfg(qc), None)
    assert message in str(e.value)


def test_flag_alone_needs_a_checkpoint():
    with pytest.raises(ValueError, match="needs a checkpoint quantized in that format"):
        quant_config_from(type("C", (), {"get_text_config": lambda self: self})(), "awq")


def test_w4a16_arguments():
    from compressed_tensors.quantization import QuantizationArgs

    def args(**kw):
        return QuantizationArgs(**{"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                   "group_size": 128, "actorder": None, **kw})

    assert W4A16Scheme.from_args(args()) == W4A16Scheme(128, False, False)
    channel = args(strategy="channel", group_size=None, actorder="weight", symmetric=True)
    assert W4A16Scheme.from_args(channel) == W4A16Scheme(-1, True, False)
    for bad, message in ((args(num_bits=8), "8-bit"), (args(strategy="tensor", group_size=None), "strategy 'tensor'")):
        with pytest.raises(ValueError, match=message):
            W4A16Scheme.from_args(bad)
    with pytest.raises(ValueError, match="W4A16 only"):
        W4A16Scheme.from_args(args(), QuantizationArgs(num_bits=8, type="int"))


def test_modules_to_not_convert_match_whole_components():
    assert module_skipped("model.layers.0.mlp.gate", ("gate",))
    assert not module_skipped("model.layers.0.mlp.gate_up_proj", ("gate",))
    assert module_skipped("model.layers.3.self_attn.qkv_proj", ("layers.3",))
    assert module_skipped("model.layers.3.self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj"))
    with pytest.raises(ValueError, match="some of"):
        module_skipped("model.layers.3.self_attn.qkv_proj", ("q_proj",))

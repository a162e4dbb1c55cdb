"""The quantization config: detection from config.json's quantization_config, the --quantization flag, and the
refusals at start-up (unknown method, the flag contradicting the checkpoint, a checkpoint-only format on a float
checkpoint, bad FP8 keys), each naming what is wrong."""
from __future__ import annotations

import pytest

from radixlm.runtime.args.choices import QUANTIZATION_METHODS
from radixlm.runtime.model_loader.files import ModelLoadError
from radixlm.runtime.quantization import QuantizationMethod, is_ignored, name_matches, quant_config_from
from radixlm.runtime.quantization.fp8 import Fp8Config, Fp8Granularity
from tests.runtime.quantization.helpers import dense_config, load, set_quantization_config, tiny_float


class _Cfg:
    def __init__(self, qc=None):
        if qc is not None:
            self.quantization_config = qc

    def get_text_config(self):
        return self


def test_flag_choices_are_the_enum():
    assert QUANTIZATION_METHODS == tuple(m.value for m in QuantizationMethod)


def test_detection_and_flags():
    assert quant_config_from(_Cfg(), None) is None
    online = quant_config_from(_Cfg(), "fp8")
    assert isinstance(online, Fp8Config) and not online.scheme.serialized
    block = quant_config_from(_Cfg({"quant_method": "fp8", "weight_block_size": [128, 128],
                                    "activation_scheme": "dynamic"}), None)
    assert block.scheme.granularity is Fp8Granularity.BLOCK and block.scheme.block == (128, 128)
    assert block.scheme.scale_name == "weight_scale_inv"
    channel = quant_config_from(_Cfg({"quant_method": "w8a8_fp8"}), "fp8")  # the fp8 family's flags are aliases
    assert channel.scheme.granularity is Fp8Granularity.CHANNEL


@pytest.mark.parametrize("qc, flag, message", [
    ({"quant_method": "bitsandbytes"}, None, "unknown quantization method 'bitsandbytes'"),
    (None, "int3", "unknown quantization method 'int3' (--quantization)"),
    ({"quant_method": "fp8"}, "awq", "--quantization awq contradicts the checkpoint, which is quantized with fp8"),
    (None, "compressed-tensors", "needs a checkpoint quantized in that format"),
    ({"activation_scheme": "dynamic"}, None, "has no quant_method"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, None, "fmt 'e5m2'"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, None, "activation_scheme 'sometimes'"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, None, "weight_block_size [128]"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}, None,
     "dynamic activation scales only"),
])
def test_refusals(qc, flag, message):
    with pytest.raises(ValueError, match=None) as e:
        quant_config_from(_Cfg(qc), flag)
    assert message in str(e.value)


def test_ignore_lists():
    assert name_matches("model.layers.0.mlp.gate", "re:.*mlp.gate$")
    assert name_matches("lm_head", "lm_head") and not name_matches("model.lm_head2", "lm_head")
    assert is_ignored("model.layers.1.self_attn.qkv_proj", ["re:.*layers.1.self_attn.[qkv]_proj"])
    assert not is_ignored("model.layers.0.self_attn.qkv_proj", ["re:.*layers.1.self_attn.[qkv]_proj"])
    with pytest.raises(ValueError, match="not all of"):
        is_ignored("model.layers.0.self_attn.qkv_proj", ["model.layers.0.self_attn.q_proj"])


def test_refused_at_start_up_by_model_config(tmp_path):
    tiny_float(tmp_path, dense_config(), seed=0)
    set_quantization_config(tmp_path, {"quant_method": "fp8"})
    with pytest.raises(ModelLoadError, match="contradicts the checkpoint"):
        load(tmp_path, "gptq")

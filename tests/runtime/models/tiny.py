"""Tiny random-weight checkpoints written with transformers (any architecture in ARCH), saved as safetensors with a
word-level tokenizer (t0 .. t{n-1}: prompts are token ids), and transformers' own greedy answers for them."""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
        "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
        "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(noise * 0.08)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)  # biases (HF's zero init would hide a mis-load)


def word_tokenizer(path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(path)


def save_tiny(config, path, seed: int = 0):
    """Writes the checkpoint and tokenizer to path; returns transformers' model (float32, eval)."""
    config.architectures = [ARCH[config.model_type]]
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    randomize(hf, seed)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    word_tokenizer(path, config.vocab_size)
    return hf


def random_prompts(seed: int, lens: list[int], vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def hf_greedy(hf, prompts, eos_ids, new_tokens: int) -> list[tuple[list[int], list[float]]]:
    """(tokens, their logprobs) of transformers' greedy generate, one prompt at a time."""
    eos = sorted(eos_ids) or None
    out = []
    with torch.inference_mode():
        for ids in prompts:
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
            new = gen.sequences[0, len(ids):].tolist()
            lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(gen.logits, new)]
            out.append((new, lps))
    return out

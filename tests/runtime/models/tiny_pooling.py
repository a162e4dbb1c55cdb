"""Tiny random-weight pooling checkpoints written with transformers: decoder backbones (AutoModel, as embedding models
are saved), BERT and XLM-RoBERTa encoders and cross-encoders, with a small WordPiece tokenizer for the encoders (built
here: nothing is downloaded), and sentence-transformers' pooling files."""
from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from transformers import (
    AutoModel, BertConfig, BertTokenizerFast, LlamaConfig, Qwen3Config, XLMRobertaConfig,
)

from tests.runtime.models.tiny import randomize, word_tokenizer

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "fast", "red", "blue", "car", "house", "big", "small",
         "what", "is", "panda", "bear", "eats", "bamboo"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def decoder_config(kind: str):
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    return Qwen3Config(head_dim=8, **common) if kind == "qwen3" else LlamaConfig(**common)


def encoder_config(kind: str, num_labels: int = 1):
    common = dict(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, num_labels=num_labels)
    if kind == "xlm-roberta":
        return XLMRobertaConfig(max_position_embeddings=66, pad_token_id=0, bos_token_id=2, eos_token_id=3, **common)
    return BertConfig(max_position_embeddings=64, pad_token_id=0, **common)


def wordpiece_tokenizer(path) -> BertTokenizerFast:
    os.makedirs(path, exist_ok=True)
    vocab = os.path.join(path, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(SPECIAL + WORDS) + "\n")
    tok = BertTokenizerFast(vocab_file=vocab)
    tok.save_pretrained(path)
    return tok


def save_model(hf_model, path, seed: int = 0):
    """Randomizes (biases and norms too, so a mis-load shows) and saves; returns the model (float32, eval)."""
    randomize(hf_model, seed)
    hf_model.eval().save_pretrained(path, safe_serialization=True)
    return hf_model


def save_decoder(path, kind: str, pooling: str | None = None, normalize: bool = True):
    """A decoder backbone saved by AutoModel (architectures Qwen3Model / LlamaModel, no lm_head) with a word-level
    tokenizer; pooling: sentence-transformers' files for this mode ("mean_tokens", "cls_token", "lasttoken")."""
    torch.manual_seed(0)
    hf = save_model(AutoModel.from_config(decoder_config(kind), dtype=torch.float32, attn_implementation="eager"),
                    path)
    word_tokenizer(path, 64)
    if pooling is not None:
        write_sentence_transformers(path, pooling, normalize)
    return hf


def save_encoder(path, model_cls, kind: str = "bert", num_labels: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    hf = save_model(model_cls(encoder_config(kind, num_labels)), path, seed)
    return hf, wordpiece_tokenizer(path)


def write_sentence_transformers(path, pooling: str, normalize: bool) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 32, f"pooling_mode_{pooling}": True}, f)


def hf_pooled(hf, ids: list[int], pooling: str, normalize: bool, token_type_ids: list[int] | None = None):
    """transformers' last hidden states of one prompt, pooled (last / mean / cls) and normalized as asked."""
    with torch.no_grad():
        kwargs = {} if token_type_ids is None else {"token_type_ids": torch.tensor([token_type_ids])}
        h = hf(torch.tensor([ids]), **kwargs).last_hidden_state[0]
    vec = {"last": h[-1], "mean": h.mean(0), "cls": h[0]}[pooling]
    return F.normalize(vec, dim=-1) if normalize else vec


class LocalScheduler:
    """A checkpoint's Scheduler stepped on the caller's thread, with the front's RequestBuilder: the Engine's path
    without its thread and start-up collection (an Engine costs ~1.5 s to start and stop in a large test process)."""

    def __init__(self, path, is_embedding: bool = True):
        from radixlm.runtime.args import ServerArgs
        from radixlm.runtime.executor.model_runner import ModelRunner
        from radixlm.runtime.front import FrontLimits, RequestBuilder
        from radixlm.runtime.model_loader.config import ModelConfig
        from radixlm.runtime.model_loader.tokenizer import get_tokenizer
        from radixlm.runtime.scheduler.scheduler import Scheduler
        from radixlm.runtime.spec.factory import DraftFactory

        args = ServerArgs(model_path=str(path), is_embedding=is_embedding, dtype="float32", device="cpu",
                          max_total_tokens=2048, enable_integrity_check=True)
        cfg = ModelConfig.from_path(args.model_path, dtype="float32", device="cpu", is_embedding=is_embedding)
        self.tokenizer = get_tokenizer(cfg.model_path)
        runner = ModelRunner(args, cfg, "cpu")
        self.scheduler = Scheduler(args, runner, self.tokenizer, cfg.eos_token_ids, DraftFactory.load(args, runner))
        self.pooler = runner.pooler
        self.builder = RequestBuilder(self.tokenizer, FrontLimits(
            cfg.vocab_size, cfg.context_len, runner.max_total_num_tokens,
            embedding_dim=runner.pooler.dim if runner.pooler is not None else 0))

    def run(self, msgs) -> list[dict]:
        """Each request's final snapshot (as the front makes them), in order."""
        from radixlm.runtime.front import ReqState

        states = {m.rid: ReqState(m.rid, self.tokenizer, m.return_logprob, False) for m in msgs}
        for m in msgs:
            self.scheduler.add_request(m)
        final: dict[str, dict] = {}
        for _ in range(100 * len(msgs)):
            for out in self.scheduler.step():
                snap = states[out.rid].update(out, "")
                if states[out.rid].finished:
                    final[out.rid] = snap
            if len(final) == len(msgs):
                return [final[m.rid] for m in msgs]
        raise AssertionError("the requests did not finish")

    def encode(self, **kwargs) -> list[dict]:
        from radixlm.runtime.embeddings import build_embed_requests

        return self.run(build_embed_requests(self.builder, **kwargs).msgs)

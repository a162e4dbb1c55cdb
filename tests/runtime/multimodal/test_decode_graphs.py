"""CUDA-graph decode for requests with images on Qwen2-VL, on CPU through the graph runner's eager stand-in
(use_graphs=False: the same padded passes over the same static buffers): rows past the prompts carry one position and
their request's M-RoPE delta as a fifth decode row, so their decode passes replay; tokens and logprobs equal
transformers' generate, next to a text-only request (offset 0) in the same passes. LLaVA's decode passes after an image
replay as they are."""
from __future__ import annotations

import pytest

import radixlm
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from tests.runtime.models.tiny_llava import png
from tests.runtime.models.tiny_qwen2_vl import IMAGE, hf_greedy, save_tiny_qwen2_vl

NEW = 6
GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def test_decode_passes_with_images_replay(tmp_path):
    hf = save_tiny_qwen2_vl(tmp_path, seed=7)
    engine = radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)
    runner = engine.runner
    runner.graph_runner = graphs = CudaGraphRunner(runner, 4, use_graphs=False)
    assert graphs.rope_offsets is not None
    replayed: list[list[int]] = []
    replay = graphs.replay

    def counting(fb):
        replayed.append([] if fb.rope_offsets is None else fb.rope_offsets.tolist())
        return replay(fb)

    graphs.replay = counting
    prompts = [f"t5 t9 {IMAGE} t7 t8", f"{IMAGE} t3", "t4 t6 t8"]
    images = [[png(1, (40, 24))], [png(2, (30, 60))], []]
    try:
        outs = engine.generate(prompts, GREEDY, image_data=images, return_logprob=True)
        tok = engine.tokenizer
    finally:
        engine.shutdown()
    for prompt, imgs, out in zip(prompts[:2], images, outs):
        ref, ref_lps = hf_greedy(hf, tmp_path, tok.encode(prompt), imgs, NEW)
        assert out["output_ids"] == ref
        assert [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]] == pytest.approx(ref_lps, abs=1e-4)
    # the decode passes replayed, with the image requests' deltas (nonzero: an image's tokens outnumber its
    # positions) and 0 for the text-only request
    with_offsets = [o for o in replayed if o]
    assert len(with_offsets) >= NEW - 1
    assert any(len(set(o)) == 3 and 0 in o for o in with_offsets)


def test_llava_decode_passes_with_images_replay(tmp_path):
    """LLaVA: decode rows carry no image rows and plain positions, so the passes after an image prefill replay."""
    from tests.runtime.models.tiny_llava import IMAGE_TOKEN, hf_greedy_with_image, save_tiny_llava

    hf = save_tiny_llava(tmp_path, seed=3)
    engine = radixlm.Engine(model_path=str(tmp_path), dtype="float32", enable_integrity_check=True)
    runner = engine.runner
    runner.graph_runner = graphs = CudaGraphRunner(runner, 4, use_graphs=False)
    assert graphs.rope_offsets is None
    sizes: list[int] = []
    replay = graphs.replay
    graphs.replay = lambda fb: (sizes.append(fb.batch_size), replay(fb))[1]
    prompt, image = f"t5 {IMAGE_TOKEN} t7", png(4)
    try:
        out = engine.generate(prompt, GREEDY, image_data=image)
        ids = engine.tokenizer.encode(prompt)
    finally:
        engine.shutdown()
    assert out["output_ids"] == hf_greedy_with_image(hf, tmp_path, ids, [image], NEW)
    assert len(sizes) >= NEW - 1

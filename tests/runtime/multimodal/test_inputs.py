"""Pad ids, the spans the planner hands the embedder, and M-RoPE positions (Qwen2-VL images, Qwen2.5-VL videos)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.multimodal.inputs import (
    PAD_RANGE, Modality, MultimodalInputs, MultimodalItem, MultimodalSpan, content_hash, pad_ids,
)


def _item(offset: int, n: int, seed: int = 0) -> MultimodalItem:
    pv = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return MultimodalItem(Modality.IMAGE, content_hash(pv), pv, offset, n)


def test_pad_ids_are_out_of_vocabulary_distinct_and_follow_the_hash():
    a, b = _item(0, 600, 1), _item(0, 600, 2)
    pa, pb = pad_ids(a.hash, 600, 1000), pad_ids(b.hash, 600, 1000)
    assert all(1000 <= p < 1000 + PAD_RANGE for p in pa + pb)
    assert len(set(pa)) == 600  # an odd stride: no id repeats within an item
    assert pa == pad_ids(_item(0, 600, 1).hash, 600, 1000)  # same pixels, same ids
    assert pa[0] != pb[0] and not set(pa) & set(pb[:1])


def test_content_hash_sees_values_shape_and_dtype():
    pv = torch.zeros(3, 4, 4)
    assert content_hash(pv) == content_hash(pv.clone())
    assert content_hash(pv) != content_hash(pv.reshape(3, 16))
    assert content_hash(pv) != content_hash(pv.double())
    pv2 = pv.clone()
    pv2[1, 2, 3] = 1e-6
    assert content_hash(pv) != content_hash(pv2)


def test_spans_cover_the_planned_positions_of_each_item():
    one, two = _item(2, 4), _item(10, 3)
    mm = MultimodalInputs([one, two])
    assert mm.spans(row=7, start=0, end=20) == [MultimodalSpan(9, one, 0, 4), MultimodalSpan(17, two, 0, 3)]
    # a chunk that starts inside the first item and ends inside the second
    assert mm.spans(row=0, start=4, end=11) == [MultimodalSpan(0, one, 2, 4), MultimodalSpan(6, two, 0, 1)]
    assert mm.spans(row=0, start=6, end=10) == []  # text between them
    assert mm.spans(row=3, start=13, end=14) == []  # after both (the output)


def test_mrope_positions_equal_transformers_rope_index():
    from transformers import Qwen2VLConfig, Qwen2VLModel

    from radixlm.runtime.multimodal.inputs import mrope_positions

    cfg = Qwen2VLConfig(text_config=dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32),
                        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, spatial_merge_size=2),
                        image_token_id=97)
    grids = [(1, 4, 6), (1, 8, 2)]
    items = [MultimodalItem(Modality.IMAGE, "a", torch.zeros(1), 3, 6, grid_thw=grids[0]),
             MultimodalItem(Modality.IMAGE, "b", torch.zeros(1), 11, 4, grid_thw=grids[1])]
    n = 18
    ids = torch.ones(1, n, dtype=torch.long)
    types = torch.zeros(1, n, dtype=torch.int)
    for it in items:
        ids[0, it.offset : it.end] = 97
        types[0, it.offset : it.end] = 1
    model = Qwen2VLModel.__new__(Qwen2VLModel)  # get_rope_index reads only the config
    model.config = cfg
    ref, delta = Qwen2VLModel.get_rope_index(model, ids, types, image_grid_thw=torch.tensor(grids))
    ours = mrope_positions(n, items, merge=2)
    assert [list(r) for r in ours.rows] == ref[:, 0].tolist()
    assert ours.delta == int(delta[0, 0])
    assert ours.axis(1, n - 2, n + 2) == ref[1, 0, -2:].tolist() + [n + ours.delta, n + 1 + ours.delta]


@pytest.mark.parametrize("grid, span", [((3, 4, 6), 0.5), ((8, 2, 2), 0.25), ((2, 4, 4), 1.0)])
def test_qwen2_5_vl_video_positions_equal_transformers_rope_index(grid, span):
    """A video's time coordinates spaced by tokens_per_second * second_per_grid_t; the second grid's time positions
    pass the text after it, so the positions past the prompt continue from their largest."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    from radixlm.runtime.multimodal.inputs import mrope_positions

    cfg = Qwen2_5_VLConfig(text_config=dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=1, intermediate_size=32),
                           vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, num_heads=2,
                                              spatial_merge_size=2, tokens_per_second=4), video_token_id=98)
    count = grid[0] * grid[1] * grid[2] // 4
    item = MultimodalItem(Modality.VIDEO, "v", torch.zeros(1), 2, count, grid_thw=grid, second_per_grid_t=span)
    n = item.end + 2
    ids = torch.ones(1, n, dtype=torch.long)
    types = torch.zeros(1, n, dtype=torch.int)
    ids[0, item.offset : item.end] = 98
    types[0, item.offset : item.end] = 2
    model = Qwen2_5_VLModel.__new__(Qwen2_5_VLModel)  # get_rope_index reads only the config
    model.config = cfg
    ref, delta = Qwen2_5_VLModel.get_rope_index(model, ids, types, video_grid_thw=torch.tensor([grid]),
                                                second_per_grid_ts=torch.tensor([span]))
    ours = mrope_positions(n, [item], merge=2, tokens_per_second=4)
    assert [list(r) for r in ours.rows] == ref[:, 0].tolist()
    assert ours.delta == int(delta[0, 0])

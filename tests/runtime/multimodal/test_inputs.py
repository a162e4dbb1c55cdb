"""Pad ids and the spans the planner hands the embedder."""
from __future__ import annotations

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

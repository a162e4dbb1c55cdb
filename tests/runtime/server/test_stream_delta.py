"""--incremental-streaming-output: cumulative snapshots become increments that add up to the final result."""
from __future__ import annotations

from radixlm.runtime.server.native import StreamDelta


def snap(text, ids, lps, finish=None):
    return {"text": text, "output_ids": ids,
            "meta_info": {"finish_reason": finish, "completion_tokens": len(ids), "output_token_logprobs": lps}}


def test_increments_add_up_to_the_cumulative_snapshots():
    snaps = [
        snap("Hel", [1], [(-0.1, 1, None)]),
        snap("Hel", [1, 2], [(-0.1, 1, None), (-0.2, 2, None)]),  # an incomplete character: no new text
        snap("Hello wor", [1, 2, 3, 4], [(-0.1, 1, None), (-0.2, 2, None), (-0.3, 3, None), (-0.4, 4, None)]),
        snap("Hello world", [1, 2, 3, 4, 5], [(-0.1, 1, None), (-0.2, 2, None), (-0.3, 3, None), (-0.4, 4, None), (-0.5, 5, None)],
             {"type": "length", "length": 5}),
    ]
    delta = StreamDelta()
    parts = [delta(s) for s in snaps]
    assert [p["text"] for p in parts] == ["Hel", "", "lo wor", "ld"]
    assert [p["output_ids"] for p in parts] == [[1], [2], [3, 4], [5]]
    assert sum((p["meta_info"]["output_token_logprobs"] for p in parts), []) == snaps[-1]["meta_info"]["output_token_logprobs"]
    assert parts[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert parts[-1]["meta_info"]["completion_tokens"] == 5  # counters stay cumulative
    assert snaps[0]["text"] == "Hel"  # the snapshots themselves are not modified

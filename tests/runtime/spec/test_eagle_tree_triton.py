"""Tree drafts with the Triton attention backend, end to end through the real Scheduler over the tiny random-weight
Llama (float32, CPU): its kernels run under TRITON_INTERPRET=1 in a subprocess (the interpreter is chosen when the
kernels are defined), GPUs hidden; the GPU run is tests/runtime/engine/test_cuda.py's.

- Oracle trees (true paths hidden among wrong siblings, test_eagle_tree_drafts.TreeOracle), pages of 4: outputs
  equal those without speculation, paths through later siblings accepted deep (their KV moved); the verification
  passes' masks go through the extend kernel's custom mask (pages of 1 and more: test_extend_tree_mask.py).
- The EAGLE head's own trees (topk 3, 3 steps; its tree steps' masks start inside the prefix): the tree steps'
  outputs and the trees node for node those the torch_native backend gives; outputs equal those without
  speculation."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter


def run_cases(device: str) -> None:
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from radixlm.runtime.spec.runners.eagle import EagleRunner
    from radixlm.runtime.kernels.startup import plan_warmup
    from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend
    from radixlm.runtime.spec.sources.model import EagleSource
    from tests.runtime.models.tiny import save_tiny
    from tests.runtime.scheduler.conftest import TINY_LLAMA, request
    from tests.runtime.scheduler.fake_serving import serve
    from tests.runtime.spec.test_eagle_drafts import _head_weights
    from tests.runtime.spec.test_eagle_tree_drafts import _record_trees, _with_oracle
    from tests.runtime.spec.test_standalone_drafts import make

    assert device == "cpu" or torch.cuda.is_available()
    root = Path(tempfile.mkdtemp())
    target, head = root / "target", root / "head"
    target.mkdir()
    head.mkdir()
    save_tiny(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}), target)
    save_file(_head_weights(5), str(head / "model.safetensors"))
    (head / "config.json").write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 1}))
    models = {"target": str(target)}

    def requests(new_tokens=(10, 12)):
        prompts = [[3 + (i * 37 + j * 11) % 490 for j in range(8 + 3 * i)] for i in range(len(new_tokens))]
        return [request(f"r{i}", p, max_new_tokens=n) for i, (p, n) in enumerate(zip(prompts, new_tokens))]

    def outputs(res):
        return {k: v["output_ids"] for k, v in res.items()}

    # Speculation off on the torch backend (on the interpreter, Triton's decode kernel would cost most of the time);
    # float32 logits of the two backends agree far closer than this model's top-two gaps.
    expected = outputs(serve(make(models, None, attention_backend="torch_native"), requests()))
    for page_size in (4,):
        sched = make(models, None, attention_backend="triton", page_size=page_size)
        assert isinstance(sched.runner.attn_backend, TritonAttnBackend)
        oracle = _with_oracle(sched, expected)
        assert outputs(serve(sched, requests())) == expected, f"oracle trees, page size {page_size}"
        stats = sched.grammar_stats
        assert oracle.proposed >= 4 and stats["accepted_draft_tokens"] > stats["draft_verifications"]
        assert sched.stats["tree_kv_moves"] > 0
        sched.check_memory()

    eagle = dict(speculative_algorithm="EAGLE", speculative_draft_model_path=str(head),
                 speculative_num_draft_tokens=8, speculative_num_steps=3, speculative_eagle_topk=3)
    trees, steps = {}, {}
    head_pass = EagleRunner._head
    for backend in ("torch_native", "triton"):
        outs = steps[backend] = []

        def recording(self, wb, mode, features):  # the head's tree steps' outputs
            out = head_pass(self, wb, mode, features)
            if wb.tree_masks is not None:
                inside = any(t.start < p for t, p in zip(wb.tree_masks, wb.prefix_lens))  # over earlier steps' KV
                outs.append((inside, out.float().cpu()))
            return out

        EagleRunner._head = recording
        try:
            sched = make(models, None, attention_backend=backend, **eagle)
            if backend == "triton":  # start-up's masked passes (run on CUDA only) on the target and the head
                assert plan_warmup(sched.runner, 0).tree_masks
                sched.runner.warm_up_extend(tree_masks=True)
                next(s for s in sched.drafts.sources if isinstance(s, EagleSource)).runner._warm_up()
            seen = _record_trees(sched)
            got = outputs(serve(sched, requests((5, 4))))
        finally:
            EagleRunner._head = head_pass
        assert sched.grammar_stats["tree_drafts"] > 0 and "tree_drafts_unsupported" not in sched.grammar_stats
        trees[backend] = [(tokens, d.tokens, d.parents) for tokens, d in seen]
        if backend == "triton":
            assert got == {rid: out[: len(got[rid])] for rid, out in expected.items()}
        sched.check_memory()
    assert trees["triton"] == trees["torch_native"]
    assert len(steps["triton"]) == len(steps["torch_native"]) and any(inside for inside, _ in steps["triton"])
    for (_, a), (_, b) in zip(steps["triton"], steps["torch_native"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_tree_drafts_with_triton_under_interpreter():
    run_under_interpreter(__file__, "triton tree drafts ok", hide_cuda=True)


if __name__ == "__main__":  # the interpreter run of test_tree_drafts_with_triton_under_interpreter
    torch.set_num_threads(1)
    run_cases("cpu")
    print("triton tree drafts ok")

"""Tree masks in the Triton extend kernel (extend_attention's custom mask, USE_CUSTOM_MASK) and the Triton backend
that builds them from ForwardBatch.tree_masks: against a float64 reference over random trees (verification masks
from spec_tree.verify_mask, rows before the root included; EAGLE-head masks that start inside the prefix; causal
requests in the same pass), several requests of different prefix and tree sizes, page sizes 1 and 4, tiles of 16
and 64 rows, masks beginning mid-key-block; the launch without a mask equal to the causal reference and (up to
rounding) to a chain tree's mask; and TritonAttnBackend.forward_extend equal to TorchNativeAttnBackend's on the same
tree pass.

On CUDA the cases run in this process; on the CPU in a subprocess under TRITON_INTERPRET=1 (the interpreter is
chosen when the kernels are defined, as in test_fused_moe.py), float32 and float16 (the 3.9 interpreter's bfloat16
tl.dot multiplies raw bits)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from radixlm.runtime.spec.tree import TreeMask, depths, verify_mask
from tests.triton_interpret import interpreter_works, run_under_interpreter


def random_parents(rng: random.Random, n: int) -> list[int]:
    """A random tree of n nodes in depth order (parents[i] < i, depths non-decreasing): any tree, renumbered."""
    raw = [i - 1 if rng.random() < 0.5 else rng.randrange(-1, i) for i in range(n)]
    d = depths(raw)
    order = sorted(range(n), key=lambda i: (d[i], i))
    index = {old: new for new, old in enumerate(order)}
    return [index[raw[i]] if raw[i] >= 0 else -1 for i in order]


def head_mask(rng: random.Random, gap: int, ext: int) -> torch.Tensor:
    """An EAGLE-head step's mask: `ext` frontier rows over `gap` scratch columns before them (each row some of them)
    and their own columns (each row itself only)."""
    mask = torch.zeros(ext, gap + ext, dtype=torch.bool)
    mask[:, :gap] = torch.rand(ext, gap, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) < 0.5
    mask[:, gap:] = torch.eye(ext, dtype=torch.bool)
    return mask


def make_pass(rng: random.Random, specs, page_size: int, heads: int, kv_heads: int, head_dim: int, dtype, device):
    """specs: per request (prefix, kind, size): "causal" (size new tokens), "tree" (size nodes after 1..3 rows, the
    root last: verify_mask), "dense" (size rows, a random mask over them), "head" (size frontier rows, the mask
    starting up to size * 2 + 1 indices into the prefix).
    Returns the pools, the per-request (prefix, extend, TreeMask | None) and the request-major q."""
    reqs = []
    for prefix, kind, size in specs:
        if kind == "causal":
            reqs.append((prefix, size, None))
        elif kind == "tree":
            before = rng.randint(1, 3)
            mask = verify_mask(random_parents(rng, size), before)
            reqs.append((prefix, before + size, TreeMask(prefix, mask)))
        elif kind == "dense":  # any mask (an earlier row may see a later key), each row seeing itself
            bits = torch.rand(size, size, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) < 0.3
            reqs.append((prefix, size, TreeMask(prefix, bits | torch.eye(size, dtype=torch.bool))))
        else:
            gap = min(prefix, 2 * size + 1)
            reqs.append((prefix, size, TreeMask(prefix - gap, head_mask(rng, gap, size))))
    totals = [p + e for p, e, _ in reqs]
    pages_needed = sum(-(-n // page_size) for n in totals)
    num_slots = (pages_needed + 3) * page_size
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    k_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g).to(dtype)
    v_buf = torch.randn(num_slots, kv_heads, head_dim, generator=g).to(dtype)
    bs = len(reqs)
    req_to_token = torch.zeros(bs + 2, max(totals) + 8, dtype=torch.int64)
    pages = (torch.randperm(num_slots // page_size - 1, generator=g) + 1).tolist()  # shuffled, page 0 unused
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    for i, n in enumerate(totals):
        own = [pages.pop() for _ in range(-(-n // page_size))]
        slots = [pg * page_size + j for pg in own for j in range(page_size)][:n]
        req_to_token[rows[i], :n] = torch.tensor(slots)
    q = torch.randn(sum(e for _, e, _ in reqs), heads, head_dim, generator=g).to(dtype)
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(k_buf), to(v_buf), to(req_to_token), to(rows), reqs


def visibility(prefix: int, ext: int, tree: TreeMask | None) -> torch.Tensor:
    """(ext, prefix + ext) bool: which keys each new token sees."""
    if tree is None:
        return torch.arange(prefix + ext)[None, :] <= (prefix + torch.arange(ext))[:, None]
    vis = torch.ones(ext, prefix + ext, dtype=torch.bool)
    vis[:, tree.start :] = tree.mask
    return vis


def reference(q, k_buf, v_buf, req_to_token, rows, reqs, scale) -> torch.Tensor:
    out, start = [], 0
    group = q.shape[1] // k_buf.shape[1]
    for i, (prefix, ext, tree) in enumerate(reqs):
        slots = req_to_token[rows[i], : prefix + ext].cpu()
        k = k_buf.cpu()[slots].double().repeat_interleave(group, dim=1)
        v = v_buf.cpu()[slots].double().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,nhd->htn", q[start : start + ext].cpu().double(), k) * scale
        s = s.masked_fill(~visibility(prefix, ext, tree), float("-inf"))
        out.append(torch.einsum("htn,nhd->thd", s.softmax(-1), v))
        start += ext
    return torch.cat(out)


def launch(q, k_buf, v_buf, req_to_token, rows, reqs, scale, masks: bool):
    from radixlm.runtime.kernels.attention.extend import extend_attention

    dev = q.device
    prefix = torch.tensor([p for p, _, _ in reqs], device=dev)
    ext = torch.tensor([e for _, e, _ in reqs], device=dev)
    starts = torch.cumsum(ext, 0) - ext
    mask_args = ()
    if masks:
        parts, mstarts, offsets, at = [], [], [], 0
        for _, e, tree in reqs:
            if tree is None:
                mstarts.append(0)
                offsets.append(-1)
                continue
            parts.append(tree.mask.reshape(-1))
            mstarts.append(tree.start)
            offsets.append(at)
            at += tree.mask.numel()
        flat = torch.cat(parts) if parts else torch.zeros(1, dtype=torch.bool)
        mask_args = (flat.to(dev), torch.tensor(mstarts, device=dev), torch.tensor(offsets, device=dev))
    return extend_attention(q, k_buf, v_buf, req_to_token, rows, prefix, ext, starts, scale, int(ext.max()),
                            *mask_args)


# Passes: (prefix, kind, size) per request. Prefixes over 64 keys cross key blocks; "head" masks start inside them.
PASSES = [
    [(0, "tree", 1)],
    [(5, "tree", 6), (0, "causal", 3), (70, "tree", 10), (1, "head", 3)],
    [(130, "head", 4), (9, "tree", 15), (64, "causal", 1), (63, "tree", 2), (200, "head", 1)],
    # over 16 rows: the 64-row tile; a dense mask's rows of the first tile see keys of the second
    [(33, "tree", 40), (100, "causal", 20), (3, "head", 2), (7, "dense", 70)],
]


def kernel_cases(device: str) -> None:
    from radixlm.runtime.kernels.attention.extend import extend_attention

    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    rng = random.Random(0)
    shapes = [(2, 1, 16), (2, 2, 24)]  # heads, KV heads, head dim (GQA; a head dim below its tile)
    for dtype in dtypes:
        tol = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}[dtype]
        for page_size in (1, 4):
            for n, specs in enumerate(PASSES):
                if dtype != torch.float32 and (n + page_size) % 2:  # the other precisions: half the passes
                    continue
                heads, kv_heads, head_dim = shapes[(n + page_size) % 2]
                if True:
                    q, k_buf, v_buf, rt, rows, reqs = make_pass(rng, specs, page_size, heads, kv_heads, head_dim,
                                                                dtype, device)
                    scale = head_dim ** -0.5
                    got = launch(q, k_buf, v_buf, rt, rows, reqs, scale, masks=True)
                    want = reference(q, k_buf, v_buf, rt, rows, reqs, scale)
                    torch.testing.assert_close(got.cpu().double(), want, atol=tol, rtol=tol,
                                               msg=lambda m: f"{dtype} page {page_size} {specs}: {m}")
                    # Without masks: the causal reference.
                    causal = [(p, e, None) for p, e, _ in reqs]
                    plain = launch(q, k_buf, v_buf, rt, rows, causal, scale, masks=False)
                    torch.testing.assert_close(plain.cpu().double(), reference(q, k_buf, v_buf, rt, rows, causal,
                                                                                scale), atol=tol, rtol=tol)
                    if dtype != torch.float32 or page_size != 1:
                        continue
                    # A pass with mask inputs but no masked request, and chain trees (the causal rule as a mask):
                    # the plain launch, up to rounding (the plain kernel walks the blocks before a query block
                    # without the mask, compiled apart), and exactly each other (the same masked walk).
                    unmasked = launch(q, k_buf, v_buf, rt, rows, causal, scale, masks=True)
                    torch.testing.assert_close(unmasked, plain, atol=1e-6, rtol=1e-5)
                    chains = [(p, e, TreeMask(p, torch.ones(e, e, dtype=torch.bool).tril())) for p, e, _ in reqs]
                    assert torch.equal(launch(q, k_buf, v_buf, rt, rows, chains, scale, masks=True), unmasked)
    # A bool mask is read as bytes: the same as a uint8 one.
    q, k_buf, v_buf, rt, rows, reqs = make_pass(rng, PASSES[1], 1, 4, 2, 16, torch.float32, device)
    prefix = torch.tensor([p for p, _, _ in reqs], device=device)
    ext = torch.tensor([e for _, e, _ in reqs], device=device)
    flat = torch.cat([t.mask.reshape(-1) for _, _, t in reqs if t is not None]).to(device)
    offs, at = [], 0
    for _, e, t in reqs:
        offs.append(-1 if t is None else at)
        at += 0 if t is None else t.mask.numel()
    mstarts = torch.tensor([0 if t is None else t.start for _, _, t in reqs], device=device)
    args = (q, k_buf, v_buf, rt, rows, prefix, ext, torch.cumsum(ext, 0) - ext, 0.25, int(ext.max()))
    a = extend_attention(*args, flat, mstarts, torch.tensor(offs, device=device))
    b = extend_attention(*args, flat.to(torch.uint8), mstarts, torch.tensor(offs, device=device))
    assert torch.equal(a, b)


def backend_cases(device: str) -> None:
    """TritonAttnBackend.forward_extend against TorchNativeAttnBackend's on one tree pass (pools, table, masks on
    the host as the planner builds them, and on the device as the EAGLE head does)."""
    from radixlm.runtime.cache.kv_quant import KVScales, quantize_kv
    from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixlm.runtime.executor.forward_batch import ForwardBatch, ForwardMode
    from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend
    from radixlm.runtime.layers.attention.triton_backend import TritonAttnBackend, tree_mask_inputs

    rng = random.Random(5)
    heads, kv_heads, head_dim = 4, 2, 16
    # The last pass: a float8 pool with K and V scales (--kv-cache-dtype fp8_e4m3), which both backends read.
    for page_size, kv_dtype in ((1, torch.float32), (4, torch.float32), (4, torch.float8_e4m3fn)):
        q, k_buf, v_buf, rt, rows, reqs = make_pass(rng, PASSES[2] + [(12, "causal", 5)], page_size, heads, kv_heads,
                                                    head_dim, torch.float32, device)
        table = ReqToTokenPool(rt.shape[0], rt.shape[1], device)
        table.req_to_token.copy_(rt)
        scales = KVScales(0.5, 4.0)
        pool = TokenToKVPool(k_buf.shape[0], page_size, kv_dtype, 1, kv_heads, head_dim, device, [scales])
        pool.get_key_buffer(0)[: k_buf.shape[0]].copy_(quantize_kv(k_buf, scales.k_scale, kv_dtype))
        pool.get_value_buffer(0)[: v_buf.shape[0]].copy_(quantize_kv(v_buf, scales.v_scale, kv_dtype))
        prefix = [p for p, _, _ in reqs]
        ext = [e for _, e, _ in reqs]
        trees = [t for _, _, t in reqs]
        trees = [t if t is None or i % 2 else TreeMask(t.start, t.mask.to(device)) for i, t in enumerate(trees)]
        runner = SimpleNamespace(model_config=SimpleNamespace(context_len=4096), num_kv_heads=kv_heads)
        layer = SimpleNamespace(layer_id=0, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                scaling=head_dim ** -0.5)
        outs = []
        for backend in (TritonAttnBackend(runner), TorchNativeAttnBackend()):
            n = sum(ext)
            fb = ForwardBatch(
                forward_mode=ForwardMode.REQUEST_SPANS, batch_size=len(reqs),
                input_ids=torch.zeros(n, dtype=torch.int64, device=device),
                positions=torch.zeros(n, dtype=torch.int64, device=device), req_pool_indices=rows,
                seq_lens=torch.tensor([p + e for p, e in zip(prefix, ext)], device=device),
                seq_lens_cpu=[p + e for p, e in zip(prefix, ext)], out_cache_loc=torch.zeros(n, dtype=torch.int64,
                                                                                             device=device),
                req_to_token_pool=table, token_to_kv_pool=pool, attn_backend=backend, extend_prefix_lens_cpu=prefix,
                extend_seq_lens_cpu=ext, extend_start_loc=torch.tensor([sum(ext[:i]) for i in range(len(ext))],
                                                                       device=device),
                tree_masks=trees)
            backend.init_forward_metadata(fb)
            outs.append(backend.forward_extend(q.reshape(n, -1), None, None, layer, fb, save_kv_cache=False))
        torch.testing.assert_close(outs[0], outs[1], atol=2e-4, rtol=2e-4)
        # A mask of the wrong shape is refused with its request.
        fb.tree_masks = [None, TreeMask(prefix[1], torch.ones(2, 2, dtype=torch.bool))] + [None] * (len(reqs) - 2)
        with pytest.raises(ValueError, match="tree mask of request 1"):
            tree_mask_inputs(fb, device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tree_masks_on_cuda():
    kernel_cases("cuda")
    backend_cases("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: test_tree_masks_on_cuda runs the kernel")
@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_tree_masks_under_interpreter():
    run_under_interpreter(__file__, "tree mask cases ok")


def test_random_parents_are_trees_in_depth_order():
    rng = random.Random(1)
    for n in range(1, 30):
        parents = random_parents(rng, n)
        d = depths(parents)
        assert all(p < i for i, p in enumerate(parents)) and d == sorted(d)


if __name__ == "__main__":  # the interpreter run of test_tree_masks_under_interpreter
    torch.set_num_threads(1)
    kernel_cases("cpu")
    backend_cases("cpu")
    print("tree mask cases ok")

"""The SGLang paper's LLaVA-bench shape: several questions about each image, written as an LM program (`sgl.image`,
then `fork`, one question and answer per branch; the fork's hint prefills the image prefix once), run with
`run_batch` through the language against `sgl.Runtime` (a radixlm server the script starts, once per cache mode) or
an already running server (--url). Per mode (the fastest of --repeat runs, each on new images): programs, questions and output tokens per second, prompt tokens and the
radix cache's hit rate (cached / prompt tokens, from the server's counters), images encoded and the encoder's share
of the wall time, and how many answers equal the first mode's (greedy: the cache must not change them).

    python benchmarks/programs/llava_bench.py --tiny --out benchmarks/results/programs/llava_bench_tiny_cpu.json
    python benchmarks/programs/llava_bench.py --model qwen2.5-vl-7b --out $OUT/llava_bench_qwen2_5_vl_7b.json  # a GPU
    python benchmarks/programs/llava_bench.py --check-shapes /tmp/vlm   # the GPU shapes, checked on the CPU

Cache modes: `radix` (the default server), `no_radix` (--disable-radix-cache: every question prefills its image
again; the encoder cache still spares re-encoding it) and `no_cache` (the radix cache off and the encoder cache at
zero bytes, which keeps only its latest output: nearly every question encodes its image again). The GPU shapes
(Qwen2.5-VL-7B, LLaVA-OneVision-7B) run with dummy weights and a word-level tokenizer over the real vocabulary
(benchmarks/lib/vlm_checkpoints.py); images are random pixels of LLaVA-bench-like sizes, questions random words.

--check-shapes DIR: the GPU shapes checked on the CPU without a model: each checkpoint directory (config, tokenizer,
processor; dummy weights) is written and read back as the server reads it, and an image of each GPU size is
preprocessed (tokens per image: the prompt sizes the GPU run meets). Used by `DRY=1 bash
benchmarks/lease/single_gpu_lease.sh vlm`."""
from __future__ import annotations

import argparse
import enum
import json
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import radixlm as sgl  # noqa: E402
from radixlm.bench.programs.data import png  # noqa: E402
from radixlm.bench.programs.workloads import image_qa  # noqa: E402
from benchmarks.lib.vlm_checkpoints import VlmCheckpoint, VlmShape, write_checkpoint  # noqa: E402

GPU_SIZES = [(1024, 768), (1280, 960), (768, 1024)]  # LLaVA-bench's photos are ~1-2 megapixels
STAT_KEYS = ("prompt_tokens", "cached_tokens", "prefill_tokens", "mm_encoded_items", "mm_encoder_seconds",
             "mm_encoder_cache_hits")


class CacheMode(str, enum.Enum):
    RADIX = "radix"
    NO_RADIX = "no_radix"
    NO_CACHE = "no_cache"

    def server_args(self) -> dict:
        return {CacheMode.RADIX: {}, CacheMode.NO_RADIX: {"disable_radix_cache": True},
                CacheMode.NO_CACHE: {"disable_radix_cache": True, "mm_encoder_cache_mb": 0}}[self]


@dataclass
class Workload:
    images: list[str]  # PNG files
    questions: list[list[str]]  # per image
    system: str
    max_new_tokens: int

    def batch(self, sink: dict) -> list[dict]:
        return [{"image": im, "questions": qs, "system": self.system, "max_tokens": self.max_new_tokens,
                 "sink": sink} for im, qs in zip(self.images, self.questions)]


@dataclass
class ModeResult:
    mode: str
    wall_s: float
    programs: int
    questions: int
    output_tokens: int
    programs_per_s: float
    questions_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float  # cached / prompt tokens, every request the server saw (the fork hints' too)
    images_encoded: int
    encoder_s: float
    encoder_share: float  # of the wall time
    answers_equal_first_mode: int
    answers: list[str] = field(default_factory=list, repr=False)


def words(rng: random.Random, vocab: int, n: int) -> str:
    return " ".join(f"t{rng.randrange(5, vocab)}" for _ in range(n))


def make_workload(ckpt: VlmCheckpoint, directory: Path, num_images: int, questions: int, max_new: int,
                  sizes: list[tuple[int, int]], seed: int) -> Workload:
    rng = random.Random(seed)
    images = []
    for i in range(num_images):
        p = directory / f"image_{i}.png"
        p.write_bytes(png(rng, sizes[i % len(sizes)]))
        images.append(str(p))
    # LLaVA-bench questions are ~10-30 words; its system prompt ~30.
    qs = [[words(rng, ckpt.vocab_size, rng.randint(10, 30)) for _ in range(questions)] for _ in images]
    return Workload(images, qs, words(rng, ckpt.vocab_size, 32), max_new)


def server_stats(backend: sgl.RuntimeEndpoint) -> dict:
    stats = backend.get_server_info()["internal_states"][0]["stats"]
    return {k: stats.get(k, 0) for k in STAT_KEYS}


def run_once(backend: sgl.RuntimeEndpoint, work: Workload) -> tuple[float, dict, list[dict], list[str]]:
    backend.flush_cache()
    before = server_stats(backend)
    by_image: dict[str, list[tuple[dict, str]]] = {}
    t0 = time.perf_counter()
    states = image_qa.run_batch(work.batch(by_image), backend=backend, num_threads=len(work.images), temperature=0.0)
    for st in states:
        st.text()  # finished (and any error raised) before the clock stops
    wall = time.perf_counter() - t0
    after = server_stats(backend)
    qa = [pair for im in work.images for pair in by_image[im]]
    return wall, {k: after[k] - before[k] for k in STAT_KEYS}, [m for m, _ in qa], [a for _, a in qa]


def run_mode(backend: sgl.RuntimeEndpoint, mode: str, works: list[Workload], warmup: Workload,
             first: list[str] | None) -> ModeResult:
    """Each workload once (their images differ, so none is in the encoder cache yet); the fastest one's figures."""
    image_qa.run_batch(warmup.batch({}), backend=backend, num_threads=len(warmup.images), temperature=0.0)
    runs = [run_once(backend, w) for w in works]
    answers = [a for run in runs for a in run[3]]
    wall, d, metas, _ = min(runs, key=lambda r: r[0])
    programs, questions = len(works[0].images), len(metas)
    out_tokens = sum(m["completion_tokens"] for m in metas)
    return ModeResult(
        mode, wall, programs, questions, out_tokens, programs / wall, questions / wall, out_tokens / wall,
        d["prompt_tokens"], d["cached_tokens"], d["cached_tokens"] / max(d["prompt_tokens"], 1),
        d["mm_encoded_items"], d["mm_encoder_seconds"], d["mm_encoder_seconds"] / wall,
        len(answers) if first is None else sum(a == b for a, b in zip(answers, first)), answers)


def print_table(results: list[ModeResult]) -> None:
    cols = ["mode", "wall_s", "programs_per_s", "questions_per_s", "output_tokens_per_s", "prompt_tokens",
            "hit_rate", "images_encoded", "encoder_share", "answers_equal_first_mode"]
    print(" | ".join(cols))
    for r in results:
        row = asdict(r)
        print(" | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols))
    base = next((r for r in results if r.mode == CacheMode.NO_RADIX.value), None)
    for r in results:
        if base is not None and r is not base:
            print(f"{r.mode}: {r.questions_per_s / base.questions_per_s:.2f}x the questions/s of {base.mode}")


def check_shapes(root: str) -> None:
    from PIL import Image

    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer
    from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy
    from radixlm.runtime.multimodal.processor import MultimodalProcessor

    for shape in (VlmShape.QWEN2_5_VL_7B, VlmShape.LLAVA_ONEVISION_7B):
        ck = write_checkpoint(shape, Path(root) / shape.value)
        cfg = ModelConfig.from_path(str(ck.path), dtype="bfloat16", load_format="dummy")
        proc = MultimodalProcessor.for_model(str(ck.path), get_tokenizer(str(ck.path)), MediaLoader(MediaPolicy()))
        tokens = [proc.preprocess([Image.new("RGB", size)])[0].num_tokens for size in GPU_SIZES]
        print(f"{shape.value}: {cfg.architecture}, {cfg.num_layers} layers, context {cfg.context_len}, vocab "
              f"{cfg.vocab_size}, dummy weights {not ck.has_weights}; tokens per image at {GPU_SIZES}: {tokens}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tiny random Qwen2-VL on CPU (CI-sized)")
    ap.add_argument("--model", choices=[s.value for s in VlmShape], default=None)
    ap.add_argument("--model-path", default=None, help="an existing model directory instead of a written one")
    ap.add_argument("--url", default=None, help="a running server (its own cache settings: one mode, 'server')")
    ap.add_argument("--modes", nargs="+", default=[m.value for m in CacheMode], choices=[m.value for m in CacheMode])
    ap.add_argument("--images", type=int, default=None, help="default: 8 (--tiny), 24 (LLaVA-bench's count)")
    ap.add_argument("--questions", type=int, default=3, help="questions per image")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 16 (--tiny), 256")
    ap.add_argument("--dtype", default=None, help="default: float32 (--tiny), bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per mode, each on new images: the fastest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--check-shapes", metavar="DIR", default=None,
                    help="write the GPU shapes' checkpoints under DIR, read them back and preprocess an image of each "
                         "GPU size; nothing else")
    args = ap.parse_args(argv)
    if args.check_shapes:
        check_shapes(args.check_shapes)
        return {}
    shape = VlmShape.TINY_QWEN2_VL if args.tiny else VlmShape(args.model or VlmShape.QWEN2_5_VL_7B.value)
    tiny = shape is VlmShape.TINY_QWEN2_VL
    num_images = args.images or (8 if tiny else 24)
    max_new = args.max_new_tokens or (16 if tiny else 256)
    sizes = [(224, 224), (336, 252), (280, 336)] if tiny else GPU_SIZES  # the tiny processor caps them at 448x448
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        ckpt = write_checkpoint(shape, tmp_path / "model", args.seed)
        if args.model_path:
            ckpt = VlmCheckpoint(Path(args.model_path), shape, ckpt.vocab_size, True)
        works = []
        for r in range(args.repeat + 1):
            (tmp_path / f"run{r}").mkdir()
            works.append(make_workload(ckpt, tmp_path / f"run{r}", num_images if r else 2, args.questions,
                                       max_new if r else 4, sizes, args.seed + r))
        warmup, works = works[0], works[1:]
        server = dict(model_path=str(ckpt.path), dtype=args.dtype or ("float32" if tiny else "bfloat16"),
                      device=args.device, load_format="auto" if ckpt.has_weights else "dummy")
        results: list[ModeResult] = []
        for mode in ["server"] if args.url else args.modes:
            runtime = None if args.url else sgl.Runtime(**server, **CacheMode(mode).server_args())
            backend = sgl.RuntimeEndpoint(args.url) if args.url else runtime.endpoint
            try:
                results.append(run_mode(backend, mode, works, warmup, results[0].answers if results else None))
            finally:
                backend.shutdown() if args.url else runtime.shutdown()
            print(f"{mode}: {results[-1].questions_per_s:.2f} questions/s", flush=True)
    print_table(results)
    report = {
        "command": "python " + " ".join(sys.argv if argv is None else ["benchmarks/programs/llava_bench.py", *argv]),
        "model": shape.value, "dummy_weights": not ckpt.has_weights, "images": num_images,
        "questions_per_image": args.questions, "max_new_tokens": max_new, "repeat": args.repeat, "image_sizes": [list(s) for s in sizes],
        "server_args": {k: v for k, v in server.items() if k != "model_path"},
        "platform": platform.platform(), "python": platform.python_version(),
        "results": [{k: v for k, v in asdict(r).items() if k != "answers"} for r in results],
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()

"""The embedding families of 2026 at their real sizes: mlmkit's default bundle vs sentence-transformers' torch
encode.

    python benchmarks/embedders.py --work /tmp/bench_emb                          # BERT-base, then every
                                                                                  # family below
    python benchmarks/embedders.py --work /tmp/bench_emb --families mpnet --texts 32 --rounds 2 --int8

Models (random weights: speed does not depend on them), built by transformers at the sizes of the
releases, wrapped as sentence-transformers wraps those releases, and saved: BERT-base (the reference,
whose attention onnxruntime fuses; mean pooling, Normalize), all-mpnet-base-v2 (mpnet,
mean pooling, Normalize), nomic-embed-text-v1.5 (nomic_bert, mean, Normalize), gte-base-en-v1.5 (gte,
cls, Normalize), EmbeddingGemma-300m (gemma3_text, bidirectional, mean, two Dense layers 768 -> 3072
-> 768, Normalize) and Qwen3-Embedding-0.6B (qwen3, causal, last token, Normalize). One deviation
from the releases: every model gets the same 8,000-token WordPiece tokenizer (trained here on the
standard library's docstrings) and a vocabulary of 32,000 rows: EmbeddingGemma's 262,144 and Qwen3's
151,669 rows are lookups that cost no FLOPs, but would take Qwen3's graph past ONNX's 2 GB protobuf
limit. Texts: 128 tokens each (docstring sentences joined and cut at max_seq_length 128).

Two sides per family, each in its own worker process, loaded and warmed up once, batch 32, 2 threads:
- mlmkit: ``mlmkit export ST_DIR --out BUNDLE`` with its defaults (fused fp32; ``--precision auto``
  at load, which picks bf16 through OpenVINO where the CPU has AMX or AVX512-BF16 and its gate passes),
  run by ``Pipeline.load(bundle, threads=2, batch_size=32)``;
- sentence-transformers: ``SentenceTransformer(ST_DIR, device="cpu").encode(texts, batch_size=32)``,
  torch with 2 threads, fp32.
Each pass waits for a quiet CPU and marks noisy ones (common.py). The ratio is the median of the
back-to-back rounds; each side's useful FLOP/s (common.encoder_flops) is printed as a share of the
GEMM ceiling measured at the start. The vectors of the two sides are compared (cosine) on the first pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import (
    bench_env,
    encoder_flops,
    log,
    made,
    made_by,
    print_machine,
    quiet_median,
    race,
    ratio,
    reusable,
    share,
    spread,
    stdlib_sentences,
    target,
    workers,
)
from harness import parser

VOCAB = 32_000
# family -> (the release it stands for, transformers config class, config keywords, pooling, Dense sizes)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str, list[int]]] = {
    "bert": ("BERT-base (the reference: fused attention)", "BertConfig", dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072), "mean", []),
    "mpnet": ("all-mpnet-base-v2", "MPNetConfig",
              dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                       intermediate_size=3072, max_position_embeddings=514),
              "mean", []),
    "nomic_bert": ("nomic-embed-text-v1.5", "NomicBertConfig",
                   dict(n_embd=768, n_layer=12, n_head=12, n_inner=3072,
                                                                     n_positions=8192), "mean", []),
    "gte": ("gte-base-en-v1.5", "GteConfig",
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                  intermediate_size=3072, max_position_embeddings=8192),
            "cls", []),
    "gemma3_text": ("EmbeddingGemma-300m", "Gemma3TextConfig", dict(
        hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
        intermediate_size=1152, max_position_embeddings=2048, sliding_window=512,
                                                                    use_bidirectional_attention=True,
        query_pre_attn_scalar=256), "mean", [3072, 768]),
    "qwen3": ("Qwen3-Embedding-0.6B", "Qwen3Config", dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, max_position_embeddings=32768, tie_word_embeddings=True), "lasttoken", []),
}


def build(work: Path, family: str) -> Path:
    """The sentence-transformers folder of ``family`` at its release's size (random weights), and its bundle.
    """
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from mlmkit.text.tokenizer import train_tokenizer

    release, cfg_name, kw, mode, dense = FAMILIES[family]
    d = work / family
    key = made_by(__file__, family=family, vocab=VOCAB, kw=kw, mode=mode, dense=dense)
    if reusable(d, key):
        return d
    log(f"building {family} ({release}'s sizes, random weights)")
    tok = train_tokenizer(stdlib_sentences()[:20_000], vocab_size=8000)
    hf = d / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]",
                                                pad_token="[PAD]",
                                                unk_token="[UNK]", mask_token="[MASK]", model_max_length=512)
    cfg = getattr(transformers, cfg_name)(vocab_size=VOCAB, pad_token_id=fast.pad_token_id, **kw)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(cfg).save_pretrained(hf)
    fast.save_pretrained(hf)
    modules: list[Any] = [Transformer(str(hf), max_seq_length=128)]
    width = modules[0].get_embedding_dimension()
    modules.append(Pooling(width, pooling_mode=mode))
    for out in dense:
        modules.append(Dense(width, out, bias=False, activation_function=torch.nn.Identity()))
        width = out
    modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(d / "st"))
    for out, extra in (("bundle", []), ("bundle-int8", ["--quantize", "int8"])):
        r = subprocess.run([sys.executable, "-m", "mlmkit", "export", str(d / "st"), "--out", str(d / out),
                            *extra],
                           env=bench_env(), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"mlmkit export {' '.join(extra)} of {family} failed: {r.stderr.strip()[-600:]}")
    made(d, key)
    return d


def texts(n: int) -> list[str]:
    """``n`` texts of at least 128 tokens: docstring sentences joined (cut at max_seq_length)."""
    s = stdlib_sentences()
    return [" ".join(s[i * 30:(i + 1) * 30]) for i in range(n)]


def _cosine(p: list[float], q: list[float]) -> float:
    return float(sum(x * y for x, y in zip(p, q)) / ((sum(x * x for x in p) * sum(y * y for y in q)) ** 0.5
                                                     or 1))


def side(work: Path, family: str, name: str, n: int, threads: int) -> None:
    """A worker: load one side, warm it up, then time passes over the texts (common.answer_passes)."""
    from common import answer_passes

    d, xs = work / family, texts(n)
    if name.startswith("mlmkit"):
        from mlmkit.runtime.pipeline import Pipeline

        pipe = Pipeline.load(d / ("bundle-int8" if name == "mlmkit-int8" else "bundle"), threads=threads,
                             batch_size=32)

        def one(_: list[str]) -> dict[str, Any]:
            return {"n": len(xs), "preds": [r["embedding"][:8] for r in pipe(xs)[:4]]}
    else:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(str(d / "st"), device="cpu")

        def one(_: list[str]) -> dict[str, Any]:
            v = model.encode(xs, batch_size=32, convert_to_numpy=True)
            return {"n": len(xs), "preds": [list(map(float, r[:8])) for r in v[:4]]}
    one([])
    answer_passes({"side": name}, one)


def main() -> None:
    ap = parser(__doc__, work="runs/bench-embedders", rounds=3, threads=2)
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma-separated, of: " + ", ".join(FAMILIES))
    ap.add_argument("--texts", type=int, default=64, help="texts of 128 tokens a pass (default 64)")
    ap.add_argument("--int8", action="store_true", help="also time the int8 bundle (export --quantize int8)")
    ap.add_argument("--family", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        return side(a.work, a.family, a.side, a.texts, a.threads)
    from mlmkit.models import BY_MODEL_TYPE

    ceiling = print_machine(a.threads)
    ratios = {}
    for family in a.families.split(","):
        if family not in BY_MODEL_TYPE:
            print(f"{family}: not a family mlmkit runs here: skipped")
            continue
        d = build(a.work, family)
        args = {s: ["--work", str(a.work), "--family", family, "--side", s, "--texts", str(a.texts),
                    "--threads", str(a.threads)]
                for s in ("mlmkit", *(["mlmkit-int8"] if a.int8 else []), "sentence-transformers")}
        with workers(Path(__file__), args, env={"OMP_NUM_THREADS": str(a.threads)}) as ws:
            res = race(ws, a.rounds, a.patience, label=f"{family} ", width=22)
        flops = encoder_flops(d / "hf", [128] * a.texts) / a.texts  # per text
        speeds = {s: quiet_median(v, res["others"][s]) for s, v in res["speeds"].items()}
        ratios[family] = ratio(res, "mlmkit", "sentence-transformers")
        cos = min(_cosine(p, q)
                  for p, q in zip(res["preds"]["mlmkit"], res["preds"]["sentence-transformers"]))
        print(f"{family} ({FAMILIES[family][0]}): mlmkit {speeds['mlmkit']:.1f} texts/s "
              f"({share(speeds['mlmkit'] * flops, ceiling)}), sentence-transformers "
              f"{speeds['sentence-transformers']:.1f} "
              f"({share(speeds['sentence-transformers'] * flops, ceiling)}); {ratios[family]:.2f}x "
              f"({spread(res, 'mlmkit', 'sentence-transformers')}); first 8 dims' cosine >= {cos:.4f}",
              flush=True)
        if a.int8:
            cos8 = min(_cosine(p, q)
                       for p, q in zip(res["preds"]["mlmkit-int8"], res["preds"]["sentence-transformers"]))
            print(f"{family} int8: {speeds['mlmkit-int8']:.1f} texts/s, "
                  f"{ratio(res, 'mlmkit-int8', 'sentence-transformers'):.2f}x "
                  f"sentence-transformers fp32 ({spread(res, 'mlmkit-int8', 'sentence-transformers')}); "
                  "first 8 dims' "
                  f"cosine >= {cos8:.4f} (random weights: a floor)", flush=True)
    if ratios:
        print(target("embedders-vs-sentence-transformers-min", min(ratios.values()), ">=", 2.0))
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()

"""fastembed's late-interaction model as a peer: a colbert bundle's own model.onnx turned into token
vectors by fastembed's LateInteractionTextEmbedding, timed, one JSON line out.

Run by the python of its own venv, never mlmkit's (fastembed pins huggingface-hub below 2, which
mlmkit's transformers is past): this script imports neither mlmkit nor common.py.

    PINS = ["fastembed==0.9.1"]   # for harness.peers_python(venv, PINS)

    python fastembed_peer.py --model DIR --documents FILE [--threads 2] [--batch-size 256] [--result FILE]

DIR holds model.onnx (a colbert bundle's: input_ids, attention_mask, token_type_ids -> vectors) and
the run's tokenizer files (tokenizer.json, tokenizer_config.json with the run's model_max_length,
config.json). fastembed loads it as its colbert-ir/colbertv2.0 model (``specific_model_path``: the
same 128-dimension output; nothing is downloaded): it inserts its document marker token after [CLS],
masks the punctuation skiplist and padding, and normalises each vector. FILE is a document a line.

    {"encode_seconds", "vectors", "documents", "fastembed", "onnxruntime", "batch_size"}

encode_seconds is the embed() call alone (the model loaded before it), all vectors materialised.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harness import parser


def main() -> None:
    ap = parser(__doc__, patience=None, threads=2)
    ap.add_argument("--model", type=Path, required=True, help="the colbert model's folder (its ONNX export)")
    ap.add_argument("--documents", type=Path, required=True, help="a text file, one document a line")
    ap.add_argument("--batch-size", type=int, default=256, help="fastembed's own default")
    ap.add_argument("--result", type=Path, default=None, help="also write the JSON line here")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import fastembed
    import onnxruntime
    from fastembed import LateInteractionTextEmbedding

    docs = args.documents.read_text(encoding="utf-8").splitlines()
    model = LateInteractionTextEmbedding("colbert-ir/colbertv2.0", specific_model_path=str(args.model),
                                         threads=args.threads)
    t0 = time.perf_counter()
    got = list(model.embed(docs, batch_size=args.batch_size))
    seconds = time.perf_counter() - t0
    line = json.dumps({"encode_seconds": seconds, "vectors": int(sum(len(v) for v in got)),
                       "documents": len(got),
                       "fastembed": fastembed.__version__, "onnxruntime": onnxruntime.__version__,
                       "batch_size": args.batch_size})
    if args.result is not None:
        args.result.write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()

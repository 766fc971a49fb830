"""Lattice recorder for exact replay of τ (CONTRACTS §4).

`python -m refspec.record --device SLOT --requests REQUESTS.jsonl --out RECORD.jsonl [--model ..]`

For each request: the target's AR greedy tokens (max_new_tokens, EOS ignored) and, for every
prefix prompt + greedy[:i], the drafter's lattice. The cost model replays any tree policy on these
offline: at position i it builds the tree from lattices[i] and accepts the longest root path equal
to greedy[i:], so τ of a policy is known without the target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import load_config
from .errors import RefspecError
from .runtime import open_engine, read_requests, write_atomic


def record_request(engine, input_ids: list[int], max_new_tokens: int) -> dict:
    """{greedy, lattices} of one request: AR decoding, drafting (not verifying) at every prefix."""
    engine.start(input_ids, max_new_tokens, drafting=True)
    greedy, lattices = [], []
    for _ in range(max_new_tokens):
        lattices.append(engine.draft().to_json())
        greedy.extend(engine.decode_step("ar", max_new_tokens))
    return {"greedy": greedy, "lattices": lattices}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refspec.record", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cpu:N or cuda:N")
    parser.add_argument("--requests", type=Path, required=True, help="request file (JSONL)")
    parser.add_argument("--out", type=Path, required=True, help="record file to write (JSONL)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--max-requests", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        config = load_config()
        requests = read_requests(args.requests, args.max_requests)
        engine = open_engine(args.device, args.model, args.cache, config)
        lines = []
        for req in requests:
            rec = record_request(engine, req.input_ids, req.max_new_tokens)
            head = {
                "id": req.id,
                "prompt_len": len(req.input_ids),
                "block_size": config.decode.block_size,
                "top_k": config.decode.top_k,
                "drafter": config.drafter.kind,
            }
            lines.append(json.dumps(head | rec))
            print(f"refspec.record: {req.id}: {req.max_new_tokens} tokens", file=sys.stderr, flush=True)
        write_atomic(args.out, "".join(line + "\n" for line in lines))
    except RefspecError as e:
        print(f"refspec.record: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

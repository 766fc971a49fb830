"""What serve, record and profile share: device slots, pinning, loading the engine, requests."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .errors import RefspecError

HYBRID = "refspec_hybrid"  # config.json model_type of a hybrid folder (hybrid.py): config only, no tensors
_SLOT = re.compile(r"^(cpu|cuda):(\d+)$")


def parse_slot(slot: str) -> tuple[str, int]:
    """'cpu:N' or 'cuda:N' -> (kind, N)."""
    m = _SLOT.match(slot)
    if not m:
        raise RefspecError(f"device slot {slot!r} is not cpu:N or cuda:N")
    return m.group(1), int(m.group(2))


def pin_cpu(core: int, threads: int) -> None:
    """Pin this process to one core with `threads` compute threads; call before importing torch."""
    cores = os.sched_getaffinity(0)
    if core not in cores:
        raise RefspecError(f"cpu:{core} is not available here; this process may run on cores {sorted(cores)}")
    os.sched_setaffinity(0, {core})
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def open_engine(slot: str, model: str, cache: Path | None, config: Config, eager: bool = False):
    """The Engine for a model name or folder on a device slot (pins a CPU slot first).

    On CUDA in bf16 the model runs as fused Triton kernels captured in CUDA graphs (cuda_graphs.py);
    anything else (CPU, or CUDA in fp32/fp16), or `eager` (batch serving needs it), runs the
    eager `Transformer`.
    """
    kind, index = parse_slot(slot)
    if kind == "cpu":
        pin_cpu(index, config.runtime.threads)
    import torch

    from . import ext
    from .generate import Engine
    from .model import Transformer, load_weights, resolve_dtype
    from .weights import load_config, resolve_model

    mechanisms = ext.load(config)
    if kind == "cpu":
        torch.set_num_threads(config.runtime.threads)
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise RefspecError(f"{slot}: no such CUDA device here; use a cpu:N slot or a visible GPU")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    dtype = resolve_dtype(config.runtime.dtype, device)
    folder = resolve_model(model, cache)
    cfg = load_config(folder)
    if cfg.get("model_type") == HYBRID:  # random weights of a GDN/attention shape
        from .hybrid import HybridArgs, HybridModel, random_state

        args = HybridArgs.from_config({k: v for k, v in cfg.items() if k != "seed"})
        return Engine(
            HybridModel(args, random_state(args, cfg.get("seed", 0)), device, dtype), config, mechanisms
        )
    args, state = load_weights(folder, device)
    if device.type == "cuda" and dtype == torch.bfloat16 and not eager:
        from .cuda_graphs import CudaModel

        net = CudaModel(args, state, device, config.runtime.max_context)
    else:
        net = Transformer(args, state, device, dtype, config.runtime.cpu_layout)
    # The CUDA model copied what it keeps: a synthetic state drawn on the GPU is freed here, before
    # a mechanism's setup (refspec-w12 converting the weights) needs the memory.
    del state
    return Engine(net, config, mechanisms)


# Short and repeating, so the drafter matches: a prefill, a verify of several rows and one-row
# steps in a few tokens (each token on one CPU core is tens of ms, paid at every start).
WARM_UP_PROMPT = [(7 * i) % 97 + 10 for i in range(8)] * 2
WARM_UP_TOKENS = {"spec": 4, "ar": 2}


def warm_up(engine, batch: bool = False) -> float:
    """Run every path once (prefill, multi-row verify, single-row AR) and capture the CUDA graphs
    of every row count the policy can verify; with `batch`, serve one two-lane group too, so the
    first timed group's batched forward is not the first. Return the seconds taken."""
    t0 = time.perf_counter()
    for mode, tokens in WARM_UP_TOKENS.items():
        for _ in engine.generate(WARM_UP_PROMPT, tokens, mode):
            pass
    capture = getattr(engine.model, "capture", None)
    if capture is not None:
        for rows in range(1, engine.policy.max_rows + 1, 16):
            capture(rows, engine.head is not None)
        capture(engine.policy.max_rows, engine.head is not None)
    if batch:
        from .batch import BatchEngine

        reqs = [Request(id=i, input_ids=WARM_UP_PROMPT[i:], max_new_tokens=8) for i in range(2)]
        for mode in ("spec", "ar"):
            for _ in BatchEngine(engine, 2).generate(reqs, mode):
                pass
    return time.perf_counter() - t0


@dataclass
class Request:
    id: str
    input_ids: list[int]
    max_new_tokens: int


def _check_id(obj: dict, what: str) -> str | int:
    rid = obj.get("id")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise RefspecError(f"a {what} needs an 'id' (a string)")
    return rid


def parse_request(obj: object) -> Request:
    """A request object of the serve protocol / request files, or a RefspecError saying what is wrong."""
    if not isinstance(obj, dict):
        raise RefspecError("a request must be a JSON object")
    rid = _check_id(obj, "request")
    ids = obj.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
        raise RefspecError("'input_ids' must be a non-empty list of integer token ids")
    n = obj.get("max_new_tokens")
    if type(n) is not int or n < 1:
        raise RefspecError("'max_new_tokens' must be a positive integer")
    return Request(id=rid, input_ids=ids, max_new_tokens=n)


MAX_BATCH = 256  # lanes of one group: a KV-cache row each


@dataclass
class Group:
    """Requests served together, at most `batch` at a time (batch serving, refspec/batch.py)."""

    id: str
    batch: int
    requests: list[Request]


def parse_group(obj: dict) -> Group:
    """A group line of the serve protocol: {"id", "batch", "requests": [request, ...]}."""
    gid = _check_id(obj, "group")
    b = obj.get("batch")
    if type(b) is not int or not 1 <= b <= MAX_BATCH:
        raise RefspecError(f"'batch' must be an integer in 1..{MAX_BATCH} (the requests served at once)")
    items = obj.get("requests")
    if not isinstance(items, list) or not items:
        raise RefspecError("'requests' must be a non-empty list of request objects")
    reqs = []
    for i, item in enumerate(items):
        try:
            reqs.append(parse_request(item))
        except RefspecError as e:
            raise RefspecError(f"requests[{i}]: {e}") from None
    ids = [r.id for r in reqs]
    if len(set(ids)) != len(ids) or gid in ids:
        raise RefspecError("the ids of a group's requests must differ from each other and from the group's")
    return Group(id=gid, batch=b, requests=reqs)


def read_requests(path: Path, limit: int | None = None) -> list[Request]:
    """The requests of a JSONL request file (one object a line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise RefspecError(f"{path}: cannot read the request file ({e})") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(parse_request(json.loads(line)))
        except (json.JSONDecodeError, RefspecError) as e:
            raise RefspecError(
                f"{path}:{no}: bad request ({e}); fix or regenerate the request file"
            ) from None
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise RefspecError(f"{path}: no requests in the file")
    return out


def write_atomic(path: Path, text: str) -> None:
    """Write a whole file or nothing (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)

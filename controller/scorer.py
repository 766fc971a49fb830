"""The token-forcing scorer: the stock target from the pristine stock tree, in FP32.

For SGLang deployments the scorer is a stock SGLang server (`sglang_scorer.py`); on a refspec GPU
deployment, this model in a worker process on the GPU (`scorer_worker.py`); `scorer_for` picks.

It is loaded from the stock tree shipped with SpecPilot (never from a candidate's tree), weights
and LM head in float32, and run teacher-forced over prompt + a system's output: row t predicts
token t+1, so one forward pass scores every output position of a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Protocol

import torch

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.stock import import_refspec

from .forcing import ScoredOutput
from .scorer_worker import WorkerScorer, serve

CHUNK = 512  # rows per forward pass (bounds the [rows, context] attention buffers)


@cache
def _stock_model(model: str, cache_dir: str, device: str):
    import_refspec()  # puts the pristine stock tree first on sys.path
    from refspec.model import load_model
    from refspec.weights import resolve_model

    folder = resolve_model(model, Path(cache_dir))
    return load_model(folder, torch.device(device), torch.float32, "plain")


class RefspecScorer:
    """Scores outputs with refspec's stock model `model` in float32, in this process on `device`."""

    def __init__(self, model: str, cache: Path, device: str = "cpu"):
        self.model = _stock_model(model, str(cache), device)

    def __enter__(self) -> RefspecScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to free: the model stays cached in this process for the next scorer."""

    @torch.inference_mode()
    def logprobs(self, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
        """[len(output), V] log-probabilities of the target at each output position."""
        seq = list(prompt) + list(output)
        p, n = len(prompt), len(output)
        model = self.model
        model.setup_cache(1, len(seq))
        logps = []
        for start in range(0, len(seq) - 1, CHUNK):
            end = min(start + CHUNK, len(seq) - 1)  # rows start..end-1 predict tokens start+1..end
            rows = end - start
            tokens = torch.tensor([seq[start:end]], device=model.device)
            positions = torch.arange(start, end, device=model.device)
            mask = torch.ones(rows, end, dtype=torch.bool, device=model.device)
            mask[:, start:] = torch.ones(rows, rows, dtype=torch.bool, device=model.device).tril()
            first = max(p - 1 - start, 0)  # only rows that predict output tokens need logits
            logits = model.forward(tokens, positions, start, mask, end, logits_rows=slice(first, rows))
            if logits is not None and logits.shape[1]:
                logps.append(torch.log_softmax(logits[0].float(), dim=-1))
        return torch.cat(logps)[-n:]

    def score(self, rid: str, prompt: Sequence[int], output: Sequence[int]) -> ScoredOutput:
        """The scorer's argmax and the margin log p(argmax) − log p(token) at every output position."""
        if not output:
            return ScoredOutput(rid, [], [], [])
        lp = self.logprobs(prompt, output)
        out = torch.tensor(list(output), dtype=torch.long, device=lp.device)
        best = lp.argmax(dim=-1)
        margin = lp.gather(1, best[:, None])[:, 0] - lp.gather(1, out[:, None])[:, 0]
        return ScoredOutput(rid, list(output), best.tolist(), margin.clamp_min(0).tolist())

    def logprob_gap(self, prompt: Sequence[int], prefix: Sequence[int], a: int, b: int) -> float:
        """|log p(a) − log p(b)| at the position after prompt + prefix (a first-divergence margin)."""
        last = self.logprobs(prompt, list(prefix) + [a])[-1]
        return abs(float(last[a] - last[b]))


class Scorer(Protocol):
    """What Phase 0 and the audit use; a scorer is a context manager (close() frees its device)."""

    def score(self, rid: str, prompt: Sequence[int], output: Sequence[int]) -> ScoredOutput: ...
    def logprob_gap(self, prompt: Sequence[int], prefix: Sequence[int], a: int, b: int) -> float: ...
    def close(self) -> None: ...
    def __enter__(self) -> Scorer: ...
    def __exit__(self, *exc: object) -> None: ...


def scorer_for(dep: Deployment, home: Home) -> Scorer:
    """The deployment's token-forcing scorer: refspec's model in this process on the CPU (a CPU
    deployment) or in a worker process on its first GPU slot (`scorer_worker.py`), or a stock SGLang
    server."""
    if dep.engine == "refspec":
        if dep.devices.slots[0].startswith("cuda"):
            return WorkerScorer(dep, home)
        return RefspecScorer(dep.target.model, home.cache)
    if dep.engine == "sglang":
        from .sglang_scorer import SglangScorer

        return SglangScorer(dep, home)
    raise SpecPilotError(
        f"deployment {dep.name!r}: no token-forcing scorer for engine {dep.engine!r} in this version"
    )


if __name__ == "__main__":  # a GPU deployment's worker (scorer_worker.WorkerScorer starts it)
    import sys

    sys.exit(serve(sys.argv[1:], RefspecScorer))

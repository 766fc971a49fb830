"""Random weights of a real model's shapes, for speed-only measurements where the real ones cannot go.

    python bench/random_weights.py --dump FOLDER --shapes SHAPES.json   # record config + tensor shapes
    python bench/random_weights.py --shapes SHAPES.json --out FOLDER    # write config.json + random weights

The device machine cannot fetch SmolLM2 and the carry limit is below its weights; a pass's time
does not depend on the values, so a folder of N(0, 0.02) tensors of the real shapes measures the
same per-row cost (never acceptance: τ comes from exact replay with the real weights).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def dump(folder: Path, shapes: Path) -> None:
    from safetensors import safe_open

    tensors: dict[str, list[int]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            tensors |= {k: list(st.get_slice(k).get_shape()) for k in st.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    config = json.loads((folder / "config.json").read_text())
    shapes.write_text(json.dumps({"config": config, "tensors": tensors}, indent=1) + "\n")


def write(shapes: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    spec = json.loads(shapes.read_text())
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {
        name: (torch.randn(shape, generator=gen) * 0.02 if len(shape) > 1 else torch.ones(shape))
        for name, shape in spec["tensors"].items()
    }
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(spec["config"], indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--dump", type=Path, help="a real HF folder whose shapes to record")
    parser.add_argument("--out", type=Path, help="folder to write the random model into")
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.shapes)
    elif args.out:
        write(args.shapes, args.out)
    else:
        parser.error("give --dump FOLDER or --out FOLDER")


if __name__ == "__main__":
    main()

"""Write a pass sweep's best tile configs into refspec's cuda_graphs.py (the stock CUDA path).

python bench/apply_tiles.py SWEEP.json    # SWEEP.json from bench/refspec_kernels.py --pass-sweep
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GRAPHS = Path(__file__).resolve().parents[1] / "deployments/stock/refspec/refspec/cuda_graphs.py"


def main() -> None:
    best = json.loads(Path(sys.argv[1]).read_text())["best"]
    src = GRAPHS.read_text()
    for fam, cfg in best.items():
        line = f"{fam} = {json.dumps(cfg)}"
        src, n = re.subn(rf"^{fam} = \{{.*\}}$", line, src, flags=re.M)
        if n != 1:
            sys.exit(f"apply_tiles: no line `{fam} = {{...}}` in {GRAPHS}")
        print(line)
    GRAPHS.write_text(src)


if __name__ == "__main__":
    main()

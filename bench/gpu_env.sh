# Source on the lent GPU machine, from the checkout root: `source bench/gpu_env.sh`.
# Installs the wheelhouse .gpu/whl (made by bench/gpu_prepare.sh; or /root/gpu/whl, copied by an
# earlier call) into /tmp/site, copies the synthetic targets' folders of .gpu/wide into the cache, links the checkout
# as the `specpilot` package, points SPECPILOT_CACHE/HOME at /root/sp, reassembles the SmolLM2 GGUF
# from /root/gpu/part-aa (copied there by an earlier call) and .gpu/gguf/part-ab when both are there,
# and defines `specpilot` as a shell function. One clear line names anything missing.
here=$PWD
export SPECPILOT_CACHE=/root/sp/cache SPECPILOT_HOME=/root/sp/home PYTHONUNBUFFERED=1
mkdir -p "$SPECPILOT_CACHE/downloads" "$SPECPILOT_HOME" /tmp/sp/specpilot
whl=.gpu/whl; [ -d "$whl" ] || whl=/root/gpu/whl     # carried in this call, or copied there by an earlier one
data=.gpu/data; [ -d "$data" ] || data=/root/gpu/data
if [ -d "$whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl \
    || { echo "gpu_env: the wheelhouse did not install; rebuild it with bench/gpu_prepare.sh"; return 1; }
fi
[ -d "$data" ] && cp -n "$data"/*.whl "$SPECPILOT_CACHE/downloads/" 2>/dev/null
[ -d .gpu/wide/models ] && mkdir -p "$SPECPILOT_CACHE/models" && cp -r .gpu/wide/models/. "$SPECPILOT_CACHE/models/"  # synthetic targets
for d in orchestrator controller costmodel memory_store agents prompts deployments kernels; do
  ln -sfn "$here/$d" "/tmp/sp/specpilot/$d"
done
export PYTHONPATH=/tmp/site:/tmp/sp
specpilot() { python3 -c "from specpilot.orchestrator.cli import main; main()" "$@"; }
missing=$(python3 - <<'PY'
import importlib
need = ["sqlalchemy", "alembic", "pydantic", "psutil", "gguf", "typer", "rich", "scipy", "tokenizers", "safetensors", "pynvml"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
[ -z "$missing" ] || echo "gpu_env: missing packages: $missing (bench/gpu_prepare.sh builds .gpu/whl; carry it)"
gguf="$SPECPILOT_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ] && [ -f /root/gpu/part-aa ] && [ -f .gpu/gguf/part-ab ]; then
  cat /root/gpu/part-aa .gpu/gguf/part-ab > "$gguf.part"
  if [ "$(sha256sum "$gguf.part" | cut -d' ' -f1)" = "$(cat .gpu/gguf/sha256)" ]; then
    mv "$gguf.part" "$gguf"
  else
    rm -f "$gguf.part"; echo "gpu_env: the reassembled GGUF does not match .gpu/gguf/sha256; carry both parts again"
  fi
fi
[ -f "$gguf" ] || echo "gpu_env: no SmolLM2 GGUF yet (first call: cp .gpu/gguf/part-aa /root/gpu/; second: carry part-ab)"

"""refspec: a compact reference speculative-decoding engine (the embedded stock tree).

Imports only torch, numpy, gguf, safetensors and tokenizers, so it runs from any worktree.
"""

from .errors import RefspecError

__all__ = ["RefspecError"]

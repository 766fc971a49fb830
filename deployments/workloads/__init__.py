"""Workloads: real benchmark prompt sets, the target's chat template, and request files (CONTRACTS §6)."""

from . import held_out
from .chat import ChatTemplate, load_chat_template, target_folder
from .request_files import (
    VARIANT,
    Request,
    judged_pool,
    judged_prompts,
    load_requests,
    pool_file,
    request_file,
    sample_prompts,
    summarize,
)
from .sources import SETS, Prompt, SetInfo, available_offline, load_prompts, local_path

__all__ = [
    "SETS",
    "ChatTemplate",
    "Prompt",
    "Request",
    "SetInfo",
    "VARIANT",
    "available_offline",
    "held_out",
    "judged_pool",
    "judged_prompts",
    "load_chat_template",
    "load_prompts",
    "load_requests",
    "local_path",
    "pool_file",
    "request_file",
    "sample_prompts",
    "summarize",
    "target_folder",
]

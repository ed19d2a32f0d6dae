"""The date chat templates write as today's, fixed per run. gpt-oss's system message carries a
"Current date": vLLM's harmony renderer (its server) takes it from `VLLM_SYSTEM_START_DATE`, else the
clock; its Hugging Face template (and Llama 3.x's "Today Date") calls `strftime_now`. A run that
crosses midnight, resumes on another day or has shards run on different days would change its prompts
mid-run. The run's date is kept in that variable (config/run.py `start_date` sets it in the command's
environment, which the managed servers it starts inherit), and every template this process renders
(engines/chat/token_ids.py, messages.render_chat, the in-process engine's chat calls) gets a
`strftime_now` that reads it."""

from __future__ import annotations

import os
from datetime import datetime

ENV = "VLLM_SYSTEM_START_DATE"
FORMAT = "%Y-%m-%d"  # the variable's form, as vLLM's harmony renderer writes it


def strftime_now(fmt: str) -> str:
    """`strftime_now` of chat templates: the run's date (ENV) at midnight where it is set, else now."""
    pinned = os.environ.get(ENV)
    return (datetime.strptime(pinned, FORMAT) if pinned else datetime.now()).strftime(fmt)

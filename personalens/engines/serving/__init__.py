"""Models behind an OpenAI-compatible endpoint: the HTTP engine (`engine.py`) with its streamed,
retried requests (`http.py`) and in-flight cap (`../flow.py`), and the vLLM servers personalens starts
for models placed on GPUs of their own or copies of a model (`managed.py`): their key middleware
(`guard.py`), their processes held by the command's `Servers` (`processes.py`) and the watchdog that
never lets one outlive personalens (`launcher.py`, started as its own process). It may import
`vllm` (a managed server gets the in-process engine's arguments), placement, `chat`, `models` and
the interface, never the factory."""

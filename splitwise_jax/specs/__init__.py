"""Layer 1, specs: what the hardware and the models are, with no model of time.

`hardware` (GPU and machine specs), `llm` (model architectures), `hf_config` (an LLM
from a Hugging Face config.json), `catalog` (the named GPUs, machines and LLMs, and
user spec files), `paper` (the Splitwise paper's tables), `batch` (a batch's
composition). Imports nothing above it. See docs/architecture.md.
"""

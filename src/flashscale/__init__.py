"""flashscale: train, quantize and serve Llama-family LLMs on NVIDIA Hopper GPUs."""

__version__ = "0.1.0"

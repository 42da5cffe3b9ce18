"""verl-mm-tools: multimodal multi-turn tool use for verl, as a plugin."""

__version__ = "0.1.0"

"""reportgen: will a fine-tuning run fit, how fast will it go, what to turn on first, with proof."""

__version__ = "0.1.0"

"""The decision tree ("what should I turn on first?") as data, and its walk for one model and GPU."""

"""Published measurements from other projects, mapped to setups and compared with our estimates."""

from pathlib import Path

#: the published rows (``reportgen compare-published --csv``) and the comparison written from them,
#: which rendering checks against the rows beside it
DEFAULT_CSV = Path("data/published_measurements.csv")
DEFAULT_OUT = Path("data/published_comparison.json")

"""Published measurements from other projects, mapped to setups and compared with our estimates."""

"""Presentation helpers shared by the terminal and the site (formatting only, no estimating)."""

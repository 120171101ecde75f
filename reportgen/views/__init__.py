"""The CLI's terminal printers: of an estimate, a measurement and a trace, and the progress bars.
How a number is written, which the site and the calculator share, is ``reportgen/format.py``."""

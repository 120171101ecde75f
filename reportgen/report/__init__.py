"""The site: results -> view models -> Jinja2 templates -> Markdown pages, SVG charts and CSV files."""

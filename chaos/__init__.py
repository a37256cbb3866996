"""A chaos run of the validation: kill workers, beat and the releaser, restart Redis, drop connections.

``python -m chaos --help``; ``chaos/__main__.py`` describes the run.
"""

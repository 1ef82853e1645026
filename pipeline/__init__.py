"""The main job end to end (ingest → transform → forecast → plan), as one command: `python -m pipeline run`."""

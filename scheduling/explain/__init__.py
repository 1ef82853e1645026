"""Explainers: turn a decision's explanation record into text (deterministic template, optional LLM narration)."""

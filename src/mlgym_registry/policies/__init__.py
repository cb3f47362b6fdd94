"""Policies: things that produce the model's text for the next turn (scripted, replay, human, transformers)."""

"""The default plugin set: parsers, prompt templates, reward assigners and action isolators."""

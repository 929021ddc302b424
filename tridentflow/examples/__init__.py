"""Bundled example pipelines (found by name: see tridentflow.registry)."""

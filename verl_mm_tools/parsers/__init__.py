"""Readers of model output formats that verl's own parsers get wrong (pure Python)."""

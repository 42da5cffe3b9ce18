"""Recorded trajectories as data: read them back (``read``), export them as verl's multi-turn SFT parquet
(``sft``), re-score them (``rescore``)."""

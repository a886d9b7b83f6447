"""Dagster wiring for kindex: partitions, assets, checks, sensors and resources.

Everything here only connects the plain-Python steps of `pipelines/` to Dagster.
"""

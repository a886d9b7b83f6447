"""GPU-worker result bundles: a safe reader, canonical values, strict validation, normalization.

No Dagster here; `assets/` wires `normalize_bundle_bytes` into the pipeline.
"""

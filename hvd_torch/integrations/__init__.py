"""hvd-torch inside the frameworks people train with (docs/integrations.md).

Each module here imports its framework only when used: hvd_torch itself never
needs Lightning, Accelerate or Transformers installed."""

"""Watching a run with the field's tools: TensorBoard event files rebuilt from the log
(`dart metrics`) and JSON log lines; the Prometheus metrics of the bus are in ``dart.bus.prom``."""

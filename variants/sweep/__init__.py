"""The sweep: build every variant of the chosen families, run and time it next to the
reference, write the run folder (config, inputs, timing, cold start, resume, metadata,
profile of the reference forward)."""

"""JFR ticks to CLOCK_MONOTONIC: chunk headers (`chunks`) and the alignment methods (`align`)."""

"""JFR ticks to CLOCK_MONOTONIC: chunk headers (`chunks`) and the alignment methods (`align`);
(CLOCK_MONOTONIC, wall clock) pairs read here (`pair`)."""

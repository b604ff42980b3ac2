"""What a user reads: the summary table (rich), the timeline picture (matplotlib), exports."""

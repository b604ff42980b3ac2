"""Fleet: many sessions (hosts x days) analyzed into one hive-partitioned Parquet dataset.

- dataset.py: the layout (docs/fleet.md) and writing one session's results into it.
- run.py: `tandem fleet analyze`, one analysis per session as a Ray task.
- summary.py: `tandem fleet summary`, the summary table over the dataset with DuckDB.
"""

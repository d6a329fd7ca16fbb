"""The parts of `python -m flash3.benchmark` (flash3/benchmark.py): the sweep, records, tables and files
(sweep.py, pure), the plot, the timing, the methods and their check, device telemetry, host overhead."""

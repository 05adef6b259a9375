"""Benchmarks: the measured cost of parts (time, memory), as tables and plots."""

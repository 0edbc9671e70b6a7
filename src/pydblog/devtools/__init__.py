"""Throwaway servers for the demo, the tests and the benchmarks."""

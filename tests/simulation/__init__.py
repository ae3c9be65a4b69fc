"""Deterministic simulation tests: dynasem's own lock code on simulated hosts."""

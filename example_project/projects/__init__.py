"""The demo app of the example project: a purge-and-rebuild view guarded by dynasem."""

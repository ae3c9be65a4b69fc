"""A deterministic simulator of dynasem's processes on one thread (issue 42); its simulated
DynamoDB is :mod:`tests.support.sim.dynamodb`."""

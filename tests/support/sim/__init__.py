"""Deterministic simulation of dynasem (issue 42): its own lock code for many processes on
simulated hosts in one thread (``runtime``), on a simulated DynamoDB with AWS's semantics
(``dynamodb``)."""

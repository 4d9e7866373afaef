"""Workloads, access analysis (islpy), assembly features and the performance model."""

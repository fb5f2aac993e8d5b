"""Collector service: ingests per-key arrivals and per-replica cache counters into the store."""

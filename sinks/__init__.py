"""Spark sinks into PostgreSQL that apply each Kafka event exactly once."""

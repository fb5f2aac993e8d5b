"""Simulated engine replica service: the engine model (services.core.engine) behind gRPC."""

"""Planner service: builds, stores and activates versioned routing plans."""

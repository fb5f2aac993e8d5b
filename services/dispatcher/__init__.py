"""Dispatcher service: stateless routing of requests to engine replicas by the active plan."""

"""deadletter."""

"""Runnable examples of jobbers. ``scripts/demo`` runs ``run_demo``."""

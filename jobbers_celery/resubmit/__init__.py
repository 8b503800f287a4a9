"""resubmit."""

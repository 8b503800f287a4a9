"""jobbers_django: see issue 5."""

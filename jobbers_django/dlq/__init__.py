"""The Django sink's dead-letter queue actions: which entries a request takes
(:mod:`.selection`), resubmit and discard them (:mod:`.actions`), and paced resubmits
(:mod:`.runs`, the control; :mod:`.run_step`, the step the Celery task drives)."""

"""DVC stage modules: one per stage of dvc.yaml, each only its command function's ``main``."""

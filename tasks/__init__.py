"""Prefect tasks: the units of work that gain something from Prefect (a retry, a timeout, a cache, a
concurrency slot, a visible step in the UI). Pure logic stays a plain function in ``gpucert/``."""

"""Batch jobs over bundles: worker processes, windows in input order, job directories (part files,
progress, resume), and Ray. No torch."""

"""Adapters to engines that run mlmkit bundles on more than one machine (optional extras)."""

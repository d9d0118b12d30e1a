"""Pretraining data: corpus files (files.py), token shards (shards.py), NSP and packed instances
(instances.py)."""

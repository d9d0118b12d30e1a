"""Training: the loop, resume state, devices, masking, pretraining, fine-tuning, tracking, plots, sweeps."""

"""Training infrastructure kept out of train.py: device and precision, checkpoints, performance figures."""

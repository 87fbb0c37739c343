"""Training infrastructure kept out of train.py, one idea a module (docs/code.md is the map)."""

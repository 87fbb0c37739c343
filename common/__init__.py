"""What training and the scripts both stand on: the machine (machine.py), a run's folder on disk (run_folder.py) and the
pictures (pictures.py). Below training/ in the imports: it reads data/, configs/ and errors.py, never training/. What
the scripts read of a checkpoint (training/checkpoint.py's load_model) stays with the checkpoint it reads, in
training/, since reading one for --resume checks the optimizer's and the random streams' state the training run
keeps."""

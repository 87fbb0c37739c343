"""What training and the scripts both stand on: the machine (machine.py), a run's folder on disk (run_folder.py) and the
pictures (pictures.py). Below training/ in the imports: it reads data/ and model/, never training/."""
